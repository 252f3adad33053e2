// Chapter 04's lock-step check against one rank.
#include "04_ddp/verify_ddp.h"

#include <utility>

#include "common/verify/compare.h"

namespace course::chapter04 {

DdpCheck::DdpCheck(const Options& o, const nn::TrainingTask& task, comm::Communicator& group,
                   const parallel::DistributedSampler& sampler, const nn::Module& model, std::int64_t local_batch,
                   std::int64_t total_steps, const optim::Recipe& training, ShareStep share_step)
    : group_(group), sampler_(sampler), model_(model), local_batch_(local_batch), training_(training),
      share_step_(std::move(share_step)) {
  // With the run's own optimizer to repeat its updates.
  auto reference = verify::make_reference([&] { return task.make_model(o.common.seed); });
  reference_training_ = std::make_unique<optim::Recipe>(o.optimizer, reference->parameters(), o.training.lr, total_steps);
  lockstep_ = std::make_unique<verify::Lockstep>(
      reference, [this](std::int64_t s) { reference_training_->update(s); }, &group_, reference_training_->clip());
  lockstep_->set_optimizer(reference_training_->optimizer());  // and its paper's formula
  if (o.faults.fault == "adamw-decay")  // the class's slip is the reference's replay's too
    dynamic_cast<optim::Adam&>(reference_training_->optimizer()).break_decoupled_decay_from(o.faults.from_step + 1);
  // --reduce-dtype bf16|fp16: the run adds its parts in 16 bits, and the bound follows (verify/compare.h).
  lockstep_->set_rounding(verify::rounding_of(o.precision.reduce()));
}

void DdpCheck::on_begin_step(std::int64_t step) { lockstep_->begin_step(step, model_); }

void DdpCheck::on_check_gradient(std::int64_t step, float loss) {
  // The reference: each rank's share of the global batch (positions r, r+R, ...) recomputed from the
  // global batch as that rank computed it, and averaged exactly.
  const int ranks = group_.size();
  const auto global = sampler_.global_batch(step, local_batch_);
  lockstep_->set_loss_scale(training_.scaler().get_scale());  // fp16: the parts carried it when they were added
  lockstep_->check_parts(step, model_, loss, static_cast<std::size_t>(ranks), 1.0 / ranks,
                         [&](nn::Module& reference, std::size_t r) {
                           const float share_loss = share_step_(reference, parallel::DistributedSampler::share_of(global, static_cast<int>(r), ranks));
                           training_.scaler().unscale_gradients(reference.parameters());  // fp16: as the run unscales
                           return share_loss;
                         });
}

void DdpCheck::on_check_update(std::int64_t step, double norm) { lockstep_->check_update(step, norm); }

verify::LockstepSummary DdpCheck::on_finish() { return lockstep_->finish(model_); }

}  // namespace course::chapter04
