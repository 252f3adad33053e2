// Chapter 06's lock-step check against one rank that restored the same checkpoint on its own.
#include "06_checkpoint_failover/verify_resume.h"

#include "common/core/memory.h"
#include "common/parallel/distributed_sampler.h"
#include "common/verify/compare.h"

namespace course::chapter06 {

ResumeCheck::ResumeCheck(const Options& o, const nn::TrainingTask& task, const data::SampleStream& stream,
                         const Trainer& trainer, comm::Communicator& group, std::int64_t global_batch)
    : o_(o), task_(task), stream_(stream), trainer_(trainer), group_(group), global_batch_(global_batch) {
  reference_ = verify::make_reference([&] { return task.make_model(o.common.seed); });
  reference_recipe_ = std::make_unique<optim::Recipe>(recipe_of(o), reference_->parameters(), o.training.lr, o.training.steps);
}

void ResumeCheck::restore(const std::string& path, const checkpoint::Loaded& loaded) {
  MemoryCategoryOverride verification(MemoryCategory::verification);
  checkpoint::restore(path, loaded, *reference_, reference_recipe_->optimizer());
}

verify::Lockstep& ResumeCheck::lockstep() {
  if (!lockstep_) {  // from the reference's state, once a resume has restored it
    lockstep_ = std::make_unique<verify::Lockstep>(
        reference_, [this](std::int64_t s) { reference_recipe_->update(s); }, &group_, reference_recipe_->clip());
    lockstep_->set_optimizer(reference_recipe_->optimizer());  // and its paper's formula
    // --reduce-dtype bf16|fp16: the run adds its parts in 16 bits, and the bound follows (verify/compare.h).
    lockstep_->set_rounding(verify::rounding_of(o_.precision.reduce()));
  }
  return *lockstep_;
}

void ResumeCheck::on_begin_step(std::int64_t step) { lockstep().begin_step(step, *trainer_.model); }

void ResumeCheck::on_check_gradient(std::int64_t step, float loss) {
  const auto global = stream_.take(step * global_batch_, global_batch_);
  const int ranks = group_.size();
  const optim::Recipe& recipe = *trainer_.recipe;
  lockstep().set_loss_scale(recipe.scaler().get_scale());  // fp16: the parts DDP averaged carried it
  lockstep().check_parts(step, *trainer_.model, loss, static_cast<std::size_t>(ranks), 1.0 / ranks,
                         [&](nn::Module& reference, std::size_t r) {
                           // In the run's precision, its loss scale undone as the run undoes it.
                           return recipe.reference_backward(reference.parameters(), [&] {
                             return task_.loss(reference, parallel::DistributedSampler::share_of(global, static_cast<int>(r), ranks));
                           });
                         });
}

void ResumeCheck::on_check_update(std::int64_t step, double norm) { lockstep().check_update(step, norm); }

verify::LockstepSummary ResumeCheck::on_finish() { return lockstep().finish(*trainer_.model); }

}  // namespace course::chapter06
