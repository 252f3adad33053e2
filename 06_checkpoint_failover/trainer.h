// Chapter 06's training: chapter 04's data-parallel step (with chapter 05's buckets) and its optimizer,
// and what a checkpoint of it must match to be loaded into this run.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "06_checkpoint_failover/options.h"
#include "common/checkpoint/training_checkpoint.h"
#include "common/data/sampling.h"
#include "common/nn/tasks.h"
#include "common/optim/recipe.h"
#include "common/parallel/ddp.h"

namespace course::chapter06 {

// What a checkpoint must match to be loaded into this run: the model's configuration and the data it
// trains on, and for the GPT the length of the schedule (a rate schedule over other --steps would make
// the rest of the run another run); the seed and the global batch, which fix the data order.
checkpoint::RunIdentity run_identity(const Options& o, const nn::TrainingTask& task, const nn::Module& model,
                                     std::int64_t global_batch);

// One training run's state: the model under DDP and its optimizer. Each rank initialises with its own
// seed; DDP's broadcast makes them identical (chapter 04).
struct Trainer {
  std::shared_ptr<nn::Module> model;
  std::unique_ptr<parallel::DistributedDataParallel> ddp;
  std::unique_ptr<optim::Recipe> recipe;
  std::vector<std::int64_t> share;  // the samples this rank trained on in the last step (--verify checks them)

  Trainer(const Options& o, const nn::TrainingTask& task, comm::Communicator& group);
  optim::Optimizer& optimizer() { return recipe->optimizer(); }

  // Chapter 04's step, in two: forward and backward on this rank's share of the global batch at
  // `position` of the sample stream, the gradients averaged (DDP, during backward); returns
  // the global batch's loss. Then the update of step `step`; returns the gradients' norm before clipping.
  float forward_backward(const nn::TrainingTask& task, const data::SampleStream& stream, std::int64_t position,
                         std::int64_t global_batch, comm::Communicator& group);
  double update(std::int64_t step);

  std::vector<float> optimizer_state_to_host() const;
};

}  // namespace course::chapter06
