// Chapter 06's checkpoints from the run's side (checkpoint::Checkpointer): one file a checkpoint, which
// rank 0 writes atomically, holding the loop's `state` (where training stands), the model and Adam's
// moments; the newest --keep kept. The failover exercise's kills happen here, not in the loop.
#pragma once
#include <cstdint>

#include "06_checkpoint_failover/options.h"
#include "06_checkpoint_failover/report.h"
#include "06_checkpoint_failover/trainer.h"
#include "common/checkpoint/checkpointer.h"
#include "common/checkpoint/folder.h"
#include "common/checkpoint/training_checkpoint.h"
#include "common/comm/communicator.h"
#include "common/metrics/metrics.h"
#include "common/nn/tasks.h"
#include "common/verify/step_check.h"

namespace course::chapter06 {

class Checkpoints final : public checkpoint::Checkpointer {
 public:
  // `state`: the loop's, which load() sets and save_if_due() writes with the trainer's model and recipe.
  // `check`: --verify's, which restores the checkpoint the run resumes on its own; `report` logs both.
  Checkpoints(const Options& o, comm::Communicator& group, const nn::TrainingTask& task, Trainer& trainer,
              std::int64_t global_batch, checkpoint::TrainingState& state, verify::StepCheck& check, Report& report,
              metrics::MetricsWriter& metrics);
  std::int64_t load() override;
  void save_if_due(std::int64_t steps_done) override;

 private:
  const Options& o_;
  comm::Communicator& group_;
  Trainer& trainer_;
  checkpoint::TrainingState& state_;
  verify::StepCheck& check_;
  Report& report_;
  metrics::MetricsWriter& metrics_;
  checkpoint::CheckpointFolder folder_;
  checkpoint::RunIdentity identity_;
};

}  // namespace course::chapter06
