// Resume or start, and save: torchtitan's checkpointer.load and checkpointer.save for a run whose ranks
// hold the same state (data parallelism, chapter 06). A checkpoint is the parameters, the optimizer's
// state and where training stands (training_state.h); rank 0 writes it, rank 0 reads it and broadcasts
// it (resume.h), and nothing its own loader would reject is ever written.
#pragma once
#include <cstdint>
#include <functional>
#include <string>

#include "common/checkpoint/folder.h"
#include "common/checkpoint/training_state.h"
#include "common/comm/communicator.h"
#include "common/metrics/metrics.h"
#include "common/nn/module.h"
#include "common/optim/recipe.h"

namespace course::checkpoint {

// What a checkpoint must agree with to continue this run: the model's configuration, the seed and the
// global batch that fix the data order, and the run's length (a checkpoint past it is refused).
struct RunIdentity {
  std::string config;
  std::uint64_t seed = 0;
  std::int64_t global_batch = 0;
  std::int64_t steps = 0;
  std::int64_t checkpoint_every = 1;  // not matched: which steps the run writes (--ckpt-every)
};

struct Start {
  TrainingState state;       // step 0, or the checkpoint's, with this world size recorded
  std::string resumed_from;  // the checkpoint's path; empty for a fresh start
  int rejected = 0;          // damaged or foreign checkpoints skipped (each logged)
};

// At start-up, on every rank of `group`: prepares `folder` (prepare_checkpoint_folder: what dead writers
// left is removed, a fresh run refuses a folder that holds checkpoints). With `resume`, the newest good
// checkpoint that matches `run` is restored into `model` and `recipe` (its optimizer's state, and fp16's
// loss scale, whose value decides which later steps skip), and into a second copy through `also_restore`
// when given (--verify's reference); the log says where, and a "resume" metric is written. A checkpoint
// of another run is a UsageError naming the flag that differs. Collective.
Start resume_training(comm::Communicator& group, CheckpointFolder& folder, bool resume, const RunIdentity& run,
                      nn::Module& model, optim::Recipe& recipe, metrics::MetricsWriter& metrics,
                      const std::function<void(const std::string& path, const Loaded&)>& also_restore = {});

// Rank 0 writes the checkpoint of `state`, `model` and `recipe` (its optimizer's state and its loss
// scale; the ranks hold the same state: one writer, one copy), after
// checking that its own loader accepts it (its values give the digest of the state in memory,
// training_state.h), logs its size and speed and writes a "checkpoint" metric. `die_halfway`: a kill
// while writing, when asked (cli::KillOptions). Returns the bytes and the milliseconds it took on rank
// 0 (zero elsewhere). The other ranks go on at once.
struct Saved {
  std::size_t bytes = 0;
  double ms = 0;
};
Saved save_training(comm::Communicator& group, const CheckpointFolder& folder, const TrainingState& state,
                    const std::string& config, const nn::Module& model, const optim::Recipe& recipe,
                    metrics::MetricsWriter& metrics, const WriteProgress& die_halfway = {});

}  // namespace course::checkpoint
