// What chapter 04 checks and reports beside its lesson: each step's time split into compute and
// communication, --verify's lock-step check against one rank with the global batch, --drift, the
// metrics, --save, and the verdict (the replicas bit-identical, every step verified, nothing diverged).
#pragma once
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "04_ddp/options.h"
#include "common/cli/session.h"
#include "common/nn/module.h"
#include "common/nn/tasks.h"
#include "common/optim/recipe.h"
#include "common/parallel/distributed_sampler.h"
#include "04_ddp/verify_ddp.h"  // ShareStep, make_ddp_check
#include "common/verify/step_check.h"

namespace course::chapter04 {

class Diagnostics {
 public:
  Diagnostics(const Options& options, cli::Session& session, const nn::TrainingTask& task,
              const parallel::DistributedSampler& sampler, nn::Module& model, std::int64_t global_batch,
              std::int64_t total_steps, optim::Recipe& training, ShareStep share_step);

  void begin_step(std::int64_t step);
  // The gradients are averaged: --verify checks them (and the loss) against one rank's (verify_ddp.h),
  // outside the timed step. `communication_ms`: the all-reduces' time in this step.
  void gradients_ready(std::int64_t step, float local_loss, double communication_ms);
  // The optimizer has stepped (clipping by `norm`): --verify checks the update; the step is logged.
  // False when the loss is not finite (the run diverged and stops).
  bool end_step(std::int64_t step, const Tensor& norm);
  // The report and the verdict: the exit code (0 passed, 1 failed).
  int finish(bool identical);

 private:
  std::vector<float> single_rank_run(bool reversed) const;

  const Options& o_;
  cli::Session& session_;
  const nn::TrainingTask& task_;
  const parallel::DistributedSampler& sampler_;
  nn::Module& model_;
  comm::Communicator& group_;
  std::int64_t global_batch_, local_batch_, total_steps_;
  const optim::Recipe& training_;  // the run's: its precision and loss scale
  std::unique_ptr<verify::StepCheck> check_;  // --verify's, or unchecked()
  double step_ms_ = 0, step_comm_ms_ = 0, total_ms_ = 0, compute_ms_ = 0, comm_ms_ = 0;
  std::int64_t timed_samples_ = 0;
  std::int64_t activations_before_ = 0, peak_activations_ = 0;  // this rank's, above the step's start
  float global_loss_ = 0;
  bool diverged_ = false;
  std::chrono::steady_clock::time_point began_;
};

}  // namespace course::chapter04
