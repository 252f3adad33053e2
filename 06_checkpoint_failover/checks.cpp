// Chapter 06's lock-step check against one rank that restored the same checkpoint on its own, and its faults.
#include "06_checkpoint_failover/checks.h"

#include "common/core/errors.h"
#include "common/core/memory.h"
#include "common/ops/kernel_faults.h"  // --fault truncating-gelu, ce-next-row
#include "common/parallel/distributed_sampler.h"  // --fault skewed-share
#include "common/verify/compare.h"

namespace course::chapter06 {

ResumeCheck::ResumeCheck(const Options& o, const nn::TrainingTask& task, const data::SampleStream& stream,
                         const Trainer& trainer, comm::Communicator& group, std::int64_t global_batch)
    : DataParallelCheck(Run{group, *trainer.model, *trainer.recipe, false, [&trainer](std::int64_t) { return trainer.share; }},
                        [&] { return task.make_model(o.common.seed); },
                        verify::rounding_of(o.precision.reduce()),  // --reduce-dtype bf16|fp16: the parts added in 16 bits
                        [&stream, global_batch](std::int64_t step) { return stream.take(step * global_batch, global_batch); },
                        as_the_recipe_computes(*trainer.recipe, task)) {}

void ResumeCheck::restore(const std::string& path, const checkpoint::Loaded& loaded) {
  MemoryCategoryOverride verification(MemoryCategory::verification);
  checkpoint::restore(path, loaded, reference(), reference_recipe().optimizer());
  resumed_path_ = path;
  resumed_ = loaded;
}

std::function<void(const std::string&, const checkpoint::Loaded&)> restores_into(verify::StepCheck& check) {
  auto* resume = dynamic_cast<ResumeCheck*>(&check);
  if (!resume) return {};
  return [resume](const std::string& path, const checkpoint::Loaded& loaded) { resume->restore(path, loaded); };
}

faults::Installation install_faults(const Options& o, Trainer& trainer, checkpoint::TrainingState& state,
                                    std::int64_t start_step, std::int64_t global_batch, int ranks) {
  faults::Installation installed;
  if (o.faults.fault == "none" || o.faults.fault == "zero-saved-moments") return installed;  // the latter: the writer's
  parallel::refuse_inert_skewed_share(o.faults.fault, ranks);
  refuse_inert_kernel_fault(o.faults.fault, o.models.model == "gpt", o.precision.dtype());
  if (o.fault_step_given && o.faults.from_step < start_step)
    throw UsageError("--fault-from-step: step " + std::to_string(o.faults.from_step) + " is before step " +
                     std::to_string(start_step) + ", where this run resumes: the fault would never act");
  faults::arm(o.faults.fault, o.fault_step_given ? o.faults.from_step : start_step);
  // Once, at the first step the fault acts in: what that step inherits from the one before.
  installed.on_step_begin([&trainer, &state, global_batch] {
    if (faults::step() != faults::first_step()) return;
    if (faults::armed("lose-optimizer-state"))  // Adam's moments zeroed, its step count kept, as a restore
      for (auto& [name, t] : trainer.optimizer().state()) {  // that forgot them would leave them
        Tensor moment = t;
        moment.fill_(0.0f);
      }
    if (faults::armed("repeat-batch")) state.samples_seen -= global_batch;  // the data back one batch
  });
  return installed;
}

}  // namespace course::chapter06
