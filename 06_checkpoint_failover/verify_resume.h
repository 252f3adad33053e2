// --verify for a run that may have resumed: one rank's model and optimizer beside the run, starting where
// the run starts (the same initialisation, or the checkpoint the run resumes, restored into it on its own),
// then in lock-step as chapter 04 checks DDP (common/verify/lockstep.h): each step's averaged gradient
// against the ranks' shares recomputed on one rank, each update against the optimizer's, bit for bit.
// Step `step` must train on the global batch at position step x global batch, whatever the run's own
// bookkeeping says, so a resume that repeats or skips data fails at its first step.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "06_checkpoint_failover/options.h"
#include "06_checkpoint_failover/trainer.h"
#include "common/checkpoint/training_checkpoint.h"
#include "common/data/sampling.h"
#include "common/nn/tasks.h"
#include "common/optim/recipe.h"
#include "common/verify/lockstep.h"
#include "common/verify/step_check.h"

namespace course::chapter06 {

class ResumeCheck final : public verify::StepCheck {
 public:
  ResumeCheck(const Options& o, const nn::TrainingTask& task, const data::SampleStream& stream, const Trainer& trainer,
              comm::Communicator& group, std::int64_t global_batch);
  // The checkpoint the run resumes, restored into the reference on its own (its digest checked too).
  void restore(const std::string& path, const checkpoint::Loaded& loaded);

 protected:
  void on_begin_step(std::int64_t step) override;
  // `loss`: the step's over the global batch.
  void on_check_gradient(std::int64_t step, float loss) override;
  void on_check_update(std::int64_t step, double norm) override;
  verify::LockstepSummary on_finish() override;

 private:
  verify::Lockstep& lockstep();  // made at its first use, after any restore
  const Options& o_;
  const nn::TrainingTask& task_;
  const data::SampleStream& stream_;
  const Trainer& trainer_;
  comm::Communicator& group_;
  std::int64_t global_batch_;
  std::shared_ptr<nn::Module> reference_;
  std::unique_ptr<optim::Recipe> reference_recipe_;
  std::unique_ptr<verify::Lockstep> lockstep_;
};

}  // namespace course::chapter06
