// What chapter 04 reports beside its lesson: each step's time split into compute and communication (the
// check's own time left out), its loss and peak activations, --drift, the metrics, --save, and the
// verdict (the replicas bit-identical, every step verified, nothing diverged).
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
#include "common/verify/step_check.h"

namespace course::chapter04 {

class Report {
 public:
  Report(const Options& options, cli::Session& session, const nn::TrainingTask& task,
         const parallel::DistributedSampler& sampler, nn::Module& model, std::int64_t global_batch,
         std::int64_t total_steps, const optim::Recipe& training);

  void begin_step(std::int64_t step);
  // The step is done: `loss` the global batch's, `communication_ms` the all-reduces' time in it,
  // `check_ms` the check's (left out). Logs it; false when the loss is not finite (the run diverged).
  bool end_step(std::int64_t step, float loss, double communication_ms, double check_ms);
  // The report and the verdict: the exit code (0 passed, 1 failed). `check`: the run's, finished here.
  int finish(bool identical, verify::StepCheck& check);

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
  double total_ms_ = 0, compute_ms_ = 0, comm_ms_ = 0;
  std::int64_t timed_samples_ = 0;
  std::int64_t activations_before_ = 0, peak_activations_ = 0;  // this rank's, above the step's start
  bool diverged_ = false;
  std::int64_t diverged_step_ = -1;
  std::chrono::steady_clock::time_point began_;
};

}  // namespace course::chapter04
