// Chapter 06's checks beside its lesson, and --fault's broken resumes.
//
// --verify for a run that may have resumed: data parallelism's lock-step check
// (common/verify/data_parallel_check.h), one rank's model and optimizer beside the run, starting where
// the run starts (the same initialisation, or the checkpoint the run resumes, restored into it on its own),
// then in lock-step as chapter 04 checks DDP: each step's averaged gradient against the ranks' shares
// recomputed on one rank, each update against the optimizer's, bit for bit. Step `step` must train on the
// global batch at position step x global batch, whatever the run's own bookkeeping says, so a resume that
// repeats or skips data fails at its first step.
#pragma once
#include <cstdint>
#include <functional>
#include <string>

#include "06_checkpoint_failover/options.h"
#include "06_checkpoint_failover/trainer.h"
#include "common/checkpoint/training_checkpoint.h"
#include "common/data/sampling.h"
#include "common/faults/faults.h"
#include "common/nn/tasks.h"
#include "common/verify/data_parallel_check.h"

namespace course::chapter06 {

// The check's gradient loss is the step's over the global batch.
class ResumeCheck final : public verify::DataParallelCheck {
 public:
  ResumeCheck(const Options& o, const nn::TrainingTask& task, const data::SampleStream& stream, const Trainer& trainer,
              comm::Communicator& group, std::int64_t global_batch);
  // The checkpoint the run resumes, restored into the reference on its own (its digest checked too), and
  // kept for the comparison at the end after a change of world size.
  void restore(const std::string& path, const checkpoint::Loaded& loaded);
  const std::string& resumed_path() const { return resumed_path_; }
  const checkpoint::Loaded& resumed() const { return resumed_; }

 private:
  std::string resumed_path_;
  checkpoint::Loaded resumed_;
};

// What resume_training calls with the checkpoint it restores: `check`'s restore with --verify, else none.
std::function<void(const std::string& path, const checkpoint::Loaded&)> restores_into(verify::StepCheck& check);

// --fault, once training starts at `start`: at step --fault-from-step, or without it at the step the run
// resumes, what that step inherits is broken (the optimizer's moments lost, or the data back one batch:
// `state` is the run's); zero-saved-moments is a writer's bug in the checkpoint library itself. Refuses a
// --fault-from-step before the step the run resumes at (it would never act), and skewed-share below 3
// ranks (`ranks`: the run's), where it does nothing. For as long as the installation lives.
faults::Installation install_faults(const Options& o, Trainer& trainer, checkpoint::TrainingState& state,
                                    std::int64_t start_step, std::int64_t global_batch, int ranks);

}  // namespace course::chapter06
