// --verify for DDP: a single-rank reference beside the run, re-synced to the run's parameters every
// step (common/verify/lockstep.h). Each step the averaged gradient must be the average of the ranks'
// shares recomputed on one rank, as each rank computed its own, within the bound of the type they were
// added in; the update must be the run's optimizer's from it (and its paper's formula), bit for bit.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "04_ddp/options.h"
#include "common/nn/module.h"
#include "common/nn/tasks.h"
#include "common/optim/recipe.h"
#include "common/parallel/distributed_sampler.h"
#include "common/verify/lockstep.h"
#include "common/verify/step_check.h"

namespace course::chapter04 {

// One rank's forward and backward on a share of the batch (the lesson's own), returning its loss.
using ShareStep = std::function<float(nn::Module& model, const std::vector<std::int64_t>& share)>;

class DdpCheck final : public verify::StepCheck {
 public:
  // `training`: the run's recipe (its loss scale); `share_step`: how a rank computed its share.
  DdpCheck(const Options& o, const nn::TrainingTask& task, comm::Communicator& group,
           const parallel::DistributedSampler& sampler, const nn::Module& model, std::int64_t local_batch,
           std::int64_t total_steps, const optim::Recipe& training, ShareStep share_step);

 protected:
  void on_begin_step(std::int64_t step) override;
  // The averaged gradients; `loss`: the step's over the global batch.
  void on_check_gradient(std::int64_t step, float loss) override;
  void on_check_update(std::int64_t step, double norm) override;
  verify::LockstepSummary on_finish() override;

 private:
  comm::Communicator& group_;
  const parallel::DistributedSampler& sampler_;
  const nn::Module& model_;
  std::int64_t local_batch_;
  const optim::Recipe& training_;
  ShareStep share_step_;
  std::unique_ptr<optim::Recipe> reference_training_;
  std::unique_ptr<verify::Lockstep> lockstep_;
};

}  // namespace course::chapter04
