// Chapter 07's sharded checkpoints, loaded and saved for the run.
#include "07_zero/checkpoints.h"

#include <chrono>
#include <cstdio>

#include "common/checkpoint/resume.h"
#include "common/core/errors.h"
#include "common/core/log.h"
#include "common/core/memory.h"
#include "common/parallel/zero_checkpoint.h"

namespace course::chapter07 {

checkpoint::Metadata checkpoint_settings(const Options& o, int stage, const std::string& model,
                                         std::int64_t global_batch) {
  auto text = [](double v) {
    char b[32];
    std::snprintf(b, sizeof b, "%.9g", v);
    return std::string(b);
  };
  return {{"stage", std::to_string(stage)},        {"model", model},
          {"seed", std::to_string(o.common.seed)}, {"global-batch", std::to_string(global_batch)},
          {"accum", std::to_string(o.accum)},      {"lr", text(o.training.lr)},
          {"clip", text(o.clip)},                  {"precision", o.precision.precision}};
  // --offload is left out: where the state lives changes no bit of it, so a run may resume either way.
}

Checkpoints::Checkpoints(const Options& o, bool active, comm::Communicator& group, parallel::ZeroOptimizer& zero,
                         const nn::Module& model, const std::string& description, std::int64_t global_batch)
    : o_(o), active_(active), group_(group), zero_(zero), model_(model),
      settings_(checkpoint_settings(o, zero.options().stage, description, global_batch)) {
  if (active && !o.checkpoints.dir.empty()) folder_.emplace(o.checkpoints.dir, o.checkpoints.keep);
}

std::int64_t Checkpoints::load() {
  if (folder_) prepare();
  const std::int64_t step = folder_ && o_.checkpoints.resume ? resume() : 0;
  if (active_) o_.kill.at_step_start(step, group_.rank());  // a node lost, when asked (--fail-at-step)
  return step;
}

// A run that refuses (a fresh run's folder holds checkpoints, a file is in a checkpoint's way) has removed
// nothing; then what writers that died left behind goes (prepare_checkpoint_folder).
void Checkpoints::prepare() {
  const checkpoint::ShardedFolder& folder = *folder_;
  checkpoint::prepare_checkpoint_folder(
      group_, o_.checkpoints.dir, o_.checkpoints.resume, [&] { return folder.remove_incomplete(); },
      [&] { return folder.has_checkpoints(); },
      [&] {
        return folder.obstruction([&](std::int64_t step) {
          return checkpoint::writes_checkpoint_at(step, o_.training.steps, o_.checkpoints.every);
        });
      });
}

std::int64_t Checkpoints::resume() {
  const std::int64_t step = parallel::resume_zero_checkpoint(*folder_, group_, zero_, settings_);
  log("resumed from step %lld (%s, %d shards)\n", static_cast<long long>(step), folder_->step_dir(step).c_str(),
      zero_.layout().shards());
  if (step > o_.training.steps)
    throw UsageError("--steps: " + std::to_string(o_.training.steps) + " is fewer than the checkpoint's " +
                     std::to_string(step));
  checkpoint::remove_dead_writes(group_, [&] { return folder_->remove_incomplete(); });  // resumed: now they may go
  return step;
}

void Checkpoints::save_if_due(std::int64_t steps_done) {
  if (folder_ && checkpoint::writes_checkpoint_at(steps_done, o_.training.steps, o_.checkpoints.every)) save(steps_done);
  if (active_ && steps_done < o_.training.steps) o_.kill.at_step_start(steps_done, group_.rank());  // the next step's start
}

void Checkpoints::save(std::int64_t steps_done) {
  const auto begin = std::chrono::steady_clock::now();
  const std::size_t bytes = parallel::save_zero_checkpoint(*folder_, group_, zero_, model_, steps_done, settings_,
                                                           o_.kill.during_save_of(steps_done, group_.rank()));
  log("checkpoint of step %lld: %s, %s from this rank in %.1f ms\n", static_cast<long long>(steps_done),
      folder_->step_dir(steps_done).c_str(), format_bytes(static_cast<std::int64_t>(bytes)).c_str(),
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - begin).count());
}

}  // namespace course::chapter07
