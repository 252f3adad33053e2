// Resume or start, and save, for a data-parallel run.
#include "common/checkpoint/training_checkpoint.h"

#include "common/faults/faults.h"

#include <algorithm>
#include <chrono>
#include <sstream>

#include "common/checkpoint/resume.h"
#include "common/core/errors.h"
#include "common/core/log.h"

namespace course::checkpoint {

Start resume_training(comm::Communicator& group, CheckpointFolder& folder, bool resume, const RunIdentity& run,
                      nn::Module& model, optim::Recipe& recipe, metrics::MetricsWriter& metrics,
                      const std::function<void(const std::string&, const Loaded&)>& also_restore) {
  optim::Optimizer& optimizer = recipe.optimizer();
  const int ranks = group.size();
  Start start;
  start.state.seed = run.seed;
  start.state.global_batch = run.global_batch;
  prepare_checkpoint_folder(
      group, folder.dir(), resume, [&] { return folder.remove_partial_writes(); }, [&] { return folder.has_checkpoints(); },
      [&] {
        return folder.obstruction(
            [&](std::int64_t step) { return writes_checkpoint_at(step, run.steps, run.checkpoint_every); });
      });
  if (!resume) {
    start.state.world_history = std::to_string(ranks) + "@0";
    start.state.world_size = ranks;
    return start;
  }
  std::string why;
  auto found = load_latest_good(
      group, folder,
      [&](const std::string& path, const Loaded& loaded) {
        check_training_checkpoint(path, loaded, model, run.config, optimizer);
      },
      [&](const std::string& line) {
        ++start.rejected;
        log("rejected %s\n", line.c_str());
      },
      &why);
  if (!found) throw UsageError("--resume: " + why);
  TrainingState& state = start.state;
  state = check_training_checkpoint(found->path, found->loaded, model, run.config, optimizer);
  if (state.global_batch != run.global_batch)
    throw UsageError("--global-batch: " + std::to_string(run.global_batch) + " differs from the checkpoint's " +
                     std::to_string(state.global_batch) + "; the steps would no longer be the same steps");
  if (state.seed != run.seed)
    throw UsageError("--seed: " + std::to_string(run.seed) + " differs from the checkpoint's " +
                     std::to_string(state.seed) + "; the data order would not continue");
  if (state.step > run.steps)
    throw UsageError("--steps: " + std::to_string(run.steps) + " is fewer than the checkpoint's " +
                     std::to_string(state.step));
  restore(found->path, found->loaded, model, optimizer);
  recipe.load_scaler_state(state.loss_scale);  // fp16: the scale goes on
  if (also_restore) also_restore(found->path, found->loaded);
  remove_dead_writes(group, [&] { return folder.remove_partial_writes(); });  // resumed: now they may go
  log("resumed from step %lld (%s, saved at %d ranks; sample position %lld, epoch %lld)\n",
      static_cast<long long>(state.step), found->path.c_str(), state.world_size,
      static_cast<long long>(state.samples_seen), static_cast<long long>(state.epoch));
  metrics.write({{"event", "resume"}, {"step", state.step}, {"path", found->path},
                 {"saved_world_size", state.world_size}, {"world_size", ranks}, {"rejected", start.rejected}});
  if (state.world_size != ranks) {  // "4@0 2@40": each world size and the step it started at
    std::ostringstream entry;
    entry << ' ' << ranks << '@' << state.step;
    state.world_history += entry.str();
  }
  state.world_size = ranks;
  start.resumed_from = found->path;
  return start;
}

Saved save_training(comm::Communicator& group, const CheckpointFolder& folder, const TrainingState& state,
                    const std::string& config, const nn::Module& model, const optim::Recipe& recipe,
                    metrics::MetricsWriter& metrics, const WriteProgress& die_halfway) {
  Saved saved;
  if (group.rank() != 0) return saved;
  const optim::Optimizer& optimizer = recipe.optimizer();
  TrainingState with_scale = state;
  with_scale.loss_scale = recipe.scaler().state();  // fp16: whether the next steps skip depends on it
  const auto begin = std::chrono::steady_clock::now();
  // What the loader would reject is never written: with --keep it would replace the good ones.
  Loaded outgoing;
  outgoing.metadata = training_metadata(with_scale, config, model, optimizer);  // the state's digest, from memory
  outgoing.tensors = training_tensors(model, optimizer);
  // --fault zero-saved-moments (chapter 06): a writer's bug, Adam's second moments written as zeros (new
  // tensors: the optimizer's own stay as they are). The check below catches it, as it would a real one.
  if (faults::active("zero-saved-moments")) {
    const std::string moments = ".exp_avg_sq";
    for (auto& [name, t] : outgoing.tensors)
      if (name.size() > moments.size() && name.compare(name.size() - moments.size(), moments.size(), moments) == 0)
        t = Tensor::zeros(t.shape(), t.device());
  }
  outgoing.checksummed = true;  // the file will carry one
  check_training_checkpoint(folder.path_for(state.step), outgoing, model, config, optimizer);
  saved.bytes = folder.save(state.step, outgoing.tensors, outgoing.metadata, die_halfway);
  saved.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - begin).count();
  log("checkpoint of step %lld: %s, %.2f MB in %.1f ms (%.0f MB/s)\n", static_cast<long long>(state.step),
      folder.path_for(state.step).c_str(), static_cast<double>(saved.bytes) / 1e6, saved.ms,
      static_cast<double>(saved.bytes) / 1e3 / std::max(saved.ms, 1e-3));
  metrics.write({{"event", "checkpoint"}, {"step", state.step}, {"bytes", saved.bytes}, {"write_ms", saved.ms}});
  return saved;
}

}  // namespace course::checkpoint
