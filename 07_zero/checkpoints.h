// Chapter 07's sharded checkpoints from the run's side (checkpoint::Checkpointer, as chapter 06 loads and
// saves its own): --ckpt-dir's checkpoints (common/parallel/zero_checkpoint.h), a shard per rank and an
// index; and --fail-at-step's kills.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include "07_zero/options.h"
#include "common/checkpoint/checkpointer.h"
#include "common/checkpoint/sharded.h"
#include "common/comm/communicator.h"
#include "common/nn/module.h"
#include "common/parallel/zero.h"

namespace course::chapter07 {

// What a run's checkpoints must match to be resumed: every setting that decides a step.
checkpoint::Metadata checkpoint_settings(const Options& o, int stage, const std::string& model,
                                         std::int64_t global_batch);

class Checkpoints final : public checkpoint::Checkpointer {
 public:
  // `active`: this run writes --ckpt-dir's checkpoints (when --ckpt-dir is given) and may be killed
  // (--fail-at-step): the chosen stage's run.
  // `model` (its description) and `global_batch` are among the settings a resume must match.
  Checkpoints(const Options& o, bool active, comm::Communicator& group, parallel::ZeroOptimizer& zero,
              const nn::Module& model, const std::string& description, std::int64_t global_batch);
  // Prepares the folder; returns the step to start at: 0, or with --resume the newest good checkpoint's,
  // its state restored into the optimizer (a damaged one is named and the one before it tried). Collective.
  std::int64_t load() override;
  // Once `steps_done` steps are done: every rank's shard and rank 0's index, when a checkpoint is due
  // (every --ckpt-every steps, and at the end). Collective.
  void save_if_due(std::int64_t steps_done) override;

 private:
  void prepare();
  std::int64_t resume();
  void save(std::int64_t steps_done);

  const Options& o_;
  bool active_;
  std::optional<checkpoint::ShardedFolder> folder_;
  comm::Communicator& group_;
  parallel::ZeroOptimizer& zero_;
  const nn::Module& model_;
  checkpoint::Metadata settings_;
};

}  // namespace course::chapter07
