// Data parallelism's lock-step check (chapters 04-06), behind verify::StepCheck: one rank's model and
// recipe beside the run, re-synced to the run's parameters every step (lockstep.h). Each step the averaged
// gradient must be the average of the ranks' shares of the global batch recomputed on one rank, each as
// its rank computed it, within the bound of the type they were added in; the update must be the
// reference recipe's from that gradient (and its paper's formula), bit for bit.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/comm/communicator.h"
#include "common/nn/module.h"
#include "common/nn/tasks.h"
#include "common/optim/recipe.h"
#include "common/verify/compare.h"
#include "common/verify/lockstep.h"
#include "common/verify/step_check.h"

namespace course::verify {

class DataParallelCheck : public StepCheck {
 public:
  // The run's side: its group, its model and its recipe (fp16's loss scale, read at every step). With
  // `loss_is_local`, check_gradient's loss is this rank's and the check averages it over the group;
  // otherwise it is the step's over the global batch.
  struct Run {
    comm::Communicator& group;
    const nn::Module& model;
    optim::Recipe& recipe;  // check_gradient unscales its gradients (fp16), as its step() would
    bool loss_is_local = false;
    // The samples this rank trained on in step `step`, in the order it took them: gathered and held
    // against the global batch (data_order.h). Empty: the data order is not checked.
    std::function<std::vector<std::int64_t>(std::int64_t step)> share = {};
  };
  // Step `step`'s global batch, the samples the ranks' shares are cut from (DistributedSampler::share_of).
  using GlobalBatch = std::function<std::vector<std::int64_t>(std::int64_t step)>;
  // One rank's forward and backward on its share, run on the reference as the rank ran it (its precision,
  // fp16's loss scale undone as the run undoes it); returns the share's loss.
  using ShareStep = std::function<float(nn::Module& reference, const std::vector<std::int64_t>& share)>;

  // The reference is `make_model()` (the run's architecture and initialisation; make_reference counts it
  // apart), updated by the run's recipe made again over its parameters (the run's options, in float32:
  // `share_step` computes each share in the run's precision and leaves float32 gradients, unscaled);
  // `rounding`: the format the run adds its parts in.
  DataParallelCheck(Run run, const std::function<std::shared_ptr<nn::Module>()>& make_model, Rounding rounding,
                    GlobalBatch global_batch, ShareStep share_step);

  // The reference as the run's recipe computes a share: task.loss on it under the recipe's precision
  // (Recipe::reference_backward).
  static ShareStep as_the_recipe_computes(const optim::Recipe& run_recipe, const nn::TrainingTask& task);

  // Before the first step: a resume restores into these (chapter 06), a fault breaks the optimizer as it
  // breaks the run's (chapter 04).
  nn::Module& reference() { return *reference_; }
  optim::Recipe& reference_recipe() { return *reference_recipe_; }

 protected:
  void on_begin_step(std::int64_t step) override;
  void on_check_gradient(std::int64_t step, float loss) override;
  void on_check_update(std::int64_t step, double norm) override;
  LockstepSummary on_finish() override;

 private:
  Lockstep& lockstep();  // made at its first use, from the reference as a resume has left it
  Run run_;
  std::shared_ptr<nn::Module> reference_;
  std::unique_ptr<optim::Recipe> reference_recipe_;
  Rounding rounding_;
  GlobalBatch global_batch_;
  ShareStep share_step_;
  std::unique_ptr<Lockstep> lockstep_;
};

}  // namespace course::verify
