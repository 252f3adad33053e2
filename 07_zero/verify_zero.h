// --verify for ZeRO: the whole model beside the sharded run, in lock-step (common/verify/lockstep.h).
// Every rank holds the whole model, and rank 0 the AdamW that ZeroOptimizer runs on its shards (the
// same arithmetic, element by element), so it repeats every update. Each step the run's parameters
// (gathered from the shards) must be the ones predicted, its averaged gradient (gathered too) the
// whole model's over the global batch, which the ranks recompute micro-batch by micro-batch as they
// computed it, and its update AdamW's, bit for bit. After a resume it starts from the resumed state.
// In mixed precision the reference is of the same precision: its float32 model holds the masters, which
// AdamW steps, and a 16-bit copy of it (their roundings) computes each part under autocast, float16's
// loss scaled as the run's, its gradients widened and unscaled as the run's; the parts then add within
// the 16-bit format's bound, since the run adds them in 16 bits.
#pragma once
#include <cstdint>
#include <memory>
#include <utility>

#include "common/nn/tasks.h"
#include "common/optim/optimizer.h"
#include "common/parallel/distributed_sampler.h"
#include "common/parallel/zero.h"
#include "common/verify/lockstep.h"
#include "common/verify/step_check.h"

namespace course::chapter07 {

class ZeroCheck final : public verify::StepCheck {
 public:
  // `first_step` above 0: the run resumed there, and the reference takes the run's resumed state.
  ZeroCheck(const nn::TrainingTask& task, parallel::ZeroOptimizer& zero, const parallel::ZeroOptions& options,
            const parallel::DistributedSampler& sampler, comm::Communicator& group, std::uint64_t seed,
            std::int64_t global_batch, int accum, std::int64_t first_step);

 protected:
  void on_begin_step(std::int64_t step) override;
  // After reduce_gradients, before apply: the averaged gradient and the loss over the global batch.
  void on_check_gradient(std::int64_t step, float loss) override;
  // After apply: the update (`norm`: the one the run clipped by).
  void on_check_update(std::int64_t step, double norm) override;
  // The final parameters (every rank's whole copy, gathered) against the last prediction and each other.
  verify::LockstepSummary on_finish() override;

 private:
  void start_from_resumed();
  // Part `batch` of the step into `reference`'s gradients, as the run computed it; returns its loss.
  float part(nn::Module& reference, const std::vector<std::int64_t>& batch, float weight);

  const nn::TrainingTask& task_;
  parallel::ZeroOptimizer& zero_;
  comm::Communicator& group_;
  const parallel::DistributedSampler& sampler_;
  std::int64_t global_batch_;
  int accum_;
  std::shared_ptr<nn::Module> reference_;  // float32: the parameters, or in mixed precision the masters
  std::shared_ptr<nn::Module> working_;    // mixed precision: the masters' 16-bit roundings
  std::unique_ptr<optim::Adam> adam_;
  std::unique_ptr<verify::Lockstep> check_;
};

}  // namespace course::chapter07
