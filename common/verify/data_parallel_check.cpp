// Data parallelism's lock-step check against one rank.
#include "common/verify/data_parallel_check.h"

#include <utility>

#include "common/comm/agree.h"  // all_reduce_scalar
#include "common/parallel/distributed_sampler.h"
#include "common/verify/data_order.h"

namespace course::verify {

namespace {
optim::RecipeOptions in_float32(optim::RecipeOptions options) {
  options.precision = DType::float32;
  return options;
}
}  // namespace

DataParallelCheck::DataParallelCheck(Run run, const std::function<std::shared_ptr<nn::Module>()>& make_model,
                                     Rounding rounding, GlobalBatch global_batch, ShareStep share_step)
    : run_(run), reference_(make_reference(make_model)),
      reference_recipe_(std::make_unique<optim::Recipe>(reference_->parameters(), in_float32(run.recipe.options()))),
      rounding_(rounding), global_batch_(std::move(global_batch)), share_step_(std::move(share_step)) {}

DataParallelCheck::ShareStep DataParallelCheck::as_the_recipe_computes(const optim::Recipe& run_recipe,
                                                                       const nn::TrainingTask& task) {
  return [&run_recipe, &task](nn::Module& reference, const std::vector<std::int64_t>& share) {
    return run_recipe.reference_backward(reference.parameters(), [&] { return task.loss(reference, share); });
  };
}

Lockstep& DataParallelCheck::lockstep() {
  if (!lockstep_) {
    lockstep_ = std::make_unique<Lockstep>(
        reference_, [this](std::int64_t s) { reference_recipe_->update(s); }, &run_.group, reference_recipe_->clip());
    lockstep_->set_optimizer(reference_recipe_->optimizer());  // and its paper's formula
    lockstep_->set_rounding(rounding_);  // a 16-bit sum's bound follows its unit roundoff (compare.h)
  }
  return *lockstep_;
}

void DataParallelCheck::on_begin_step(std::int64_t step) {
  lockstep().begin_step(step, run_.model);  // the parameters, rank 0's against the prediction, every rank's against rank 0's
  lockstep().check_replicas(step, optimizer_state(run_.recipe.optimizer()), run_.group, "optimizer state");
}

void DataParallelCheck::on_check_gradient(std::int64_t step, float loss) {
  run_.recipe.unscale_();  // fp16: the gradients the update will use (step() would unscale them next; once either way)
  const float global_loss = run_.loss_is_local ? comm::all_reduce_scalar(run_.group, loss, comm::ReduceOp::average) : loss;
  const int ranks = run_.group.size();
  const auto global = global_batch_(step);
  // What the ranks trained on, against the global batch alone: a sampler bug the reference shares (it
  // cuts its shares with the same share_of below) fails here, at its step.
  if (run_.share) {
    const std::string wrong = check_data_order(run_.group, run_.share(step), global);
    if (!wrong.empty()) lockstep().record(step, "the data order: " + wrong);
  }
  lockstep().set_loss_scale(run_.recipe.scaler().get_scale());  // fp16: the parts carried it when they were added
  // Each rank's share of the global batch (positions r, r + R, ...), recomputed as that rank computed
  // it, and averaged exactly.
  const auto share = [&](nn::Module& reference, std::size_t r) {
    return share_step_(reference, parallel::DistributedSampler::share_of(global, static_cast<int>(r), ranks));
  };
  lockstep().check_parts(step, run_.model, global_loss, static_cast<std::size_t>(ranks), 1.0 / ranks, share);
  // In 16 bits the shares above ran the run's own 16-bit kernels: held to the same shares without them.
  if (is_16bit(run_.recipe.options().precision))
    lockstep().check_emulated(step, static_cast<std::size_t>(ranks), 1.0 / ranks, share);
}

void DataParallelCheck::on_check_update(std::int64_t step, double norm) { lockstep().check_update(step, norm); }

LockstepSummary DataParallelCheck::on_finish() {
  lockstep().check_replicas(lockstep().next_step(), optimizer_state(run_.recipe.optimizer()), run_.group, "optimizer state");
  return lockstep().finish(run_.model);
}

}  // namespace course::verify
