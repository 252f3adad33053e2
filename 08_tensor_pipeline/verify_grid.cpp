// The unsharded reference of --verify, and the comparison step by step.
#include "verify_grid.h"

#include <algorithm>

#include "common/core/log.h"
#include "common/ops/ops.h"

namespace course::chapter08 {

GridCheck::GridCheck(const Options& o, const ChapterTask& task, const GridRun& run, parallel::Topology& topology)
    : o_(o), task_(task), topology_(topology), stream_(task.task.size, o.common.seed) {
  reference_ = verify::make_reference([&] { return task.task.make_model(o.common.seed); });
  trainer_ = std::make_unique<optim::Recipe>("adamw", reference_->parameters(), o.training.lr, o.training.steps,
                                              o.precision.dtype());
  // One copy of every element: the first replica's, the TP rank's that holds it (TP rank 0 for what
  // every TP rank holds whole), the first stage's tied table.
  gather_ = std::make_unique<parallel::WholeModelGather>(*run.model, *reference_, topology.world(),
                                                         [&](const std::string& name) {
                                                           return topology.dp_rank() == 0 && counts_once(run, topology, name);
                                                         });
  lockstep_ = std::make_unique<verify::Lockstep>(reference_, [this](std::int64_t step) { trainer_->update(step); },
                                                 &topology.world(), o.clip);
}

// The whole vectors put together for the check count as its memory, not the run's.
void GridCheck::begin_step(std::int64_t step) {
  MemoryCategoryOverride verification(MemoryCategory::verification);
  lockstep_->begin_step(step, gather_->parameters());
}

void GridCheck::check_gradient(std::int64_t step, float loss, const optim::Recipe& training) {
  MemoryCategoryOverride verification(MemoryCategory::verification);
  // Rank r's piece of the global batch: its r-th contiguous slice, the loss weighted by its share.
  const auto global = stream_.take(step * o_.training.global_batch, o_.training.global_batch);
  const auto ranks = static_cast<std::size_t>(topology_.size()), r = static_cast<std::size_t>(topology_.rank());
  const std::vector<std::int64_t> piece(global.begin() + static_cast<long>(r * global.size() / ranks),
                                        global.begin() + static_cast<long>((r + 1) * global.size() / ranks));
  lockstep_->check_reordered(step, gather_->gradients(), loss, [&](nn::Module& model, bool reversed) {
    if (piece.empty()) return 0.0f;
    auto samples = piece;
    if (reversed) std::reverse(samples.begin(), samples.end());
    // In the run's precision: under its autocast, backward from the loss times its loss scale, undone.
    return training.reference_backward(model.parameters(), [&] {
      return scale(task_.task.loss(model, samples), static_cast<float>(samples.size()) / static_cast<float>(global.size()));
    });
  });
}

void GridCheck::check_update(std::int64_t step, double norm) { lockstep_->check_update(step, norm); }

verify::LockstepSummary GridCheck::finish() {
  MemoryCategoryOverride verification(MemoryCategory::verification);
  return lockstep_->finish(gather_->parameters());
}

bool report_check(const verify::LockstepSummary& c, const ChapterTask& task, metrics::MetricsWriter& metrics) {
  const char* model = task.is_gpt() ? "GPT" : "MLP";
  if (c.passed)
    log("verify, %lld steps in lock-step against the unsharded %s on the whole global batch: every gradient within "
        "%g x its step's noise floor (at most %.3g of that tolerance; the largest floor %.3g), every loss (%.3g of "
        "its tolerance), every update the unsharded AdamW's, bit for bit: PASSED\n",
        static_cast<long long>(c.steps), model, verify::kNoiseFloorFactor, c.worst_gradient_ratio, c.worst_floor,
        c.worst_loss_ratio);
  else
    log("verify against the unsharded %s FAILED at step %lld: %s\n", model, static_cast<long long>(c.first_failed_step),
        c.first_failure.c_str());
  metrics.write({{"event", "verify"}, {"passed", c.passed}, {"steps", c.steps}, {"first_failed_step", c.first_failed_step},
                 {"gradient_ratio", c.worst_gradient_ratio}, {"loss_ratio", c.worst_loss_ratio},
                 {"gradient_diff", c.worst_gradient_diff}, {"noise_floor", c.worst_floor}});
  return c.passed;
}

}  // namespace course::chapter08
