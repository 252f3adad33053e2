// A run's checkpoints in two calls, the same in chapters 06 and 07: load() before the first step,
// save_if_due() after each. Behind them, a chapter's own format (06: one file that rank 0 writes; 07: a
// shard per rank and an index), the preparation of its folder, and the failover exercise's kills
// (--fail-at-step: a rank killed at the start of its step; --fail-during-save: halfway through a write),
// so that a training loop holds the lesson alone.
#pragma once
#include <cstdint>

namespace course::checkpoint {

class Checkpointer {
 public:
  virtual ~Checkpointer() = default;
  // Prepares the folder (a run that then refuses has removed nothing: prepare_checkpoint_folder) and,
  // with --resume, restores the newest good checkpoint, a damaged or foreign one named and skipped.
  // Returns the step to start at: 0 for a fresh run. Collective.
  virtual std::int64_t load() = 0;
  // Once `steps_done` steps are done: a checkpoint, when one is due (every --ckpt-every steps, and at the
  // end). Collective.
  virtual void save_if_due(std::int64_t steps_done) = 0;
};

}  // namespace course::checkpoint
