// Chapter 04's lock-step check against one rank.
#include "04_ddp/verify_ddp.h"

#include <utility>

#include "common/verify/compare.h"

namespace course::chapter04 {

std::unique_ptr<verify::StepCheck> make_ddp_check(const Options& o, const nn::TrainingTask& task, comm::Communicator& group,
                                                  const parallel::DistributedSampler& sampler, const nn::Module& model,
                                                  std::int64_t local_batch, std::int64_t total_steps,
                                                  const optim::Recipe& training, ShareStep share_step) {
  auto check = std::make_unique<verify::DataParallelCheck>(
      verify::DataParallelCheck::Run{group, model, training}, [&] { return task.make_model(o.common.seed); },
      verify::DataParallelCheck::RecipeSettings{o.optimizer, o.training.lr, total_steps},
      verify::rounding_of(o.precision.reduce()),  // --reduce-dtype bf16|fp16: the parts added in 16 bits
      [&sampler, local_batch](std::int64_t step) { return sampler.global_batch(step, local_batch); },
      [&training, share_step = std::move(share_step)](nn::Module& reference, const std::vector<std::int64_t>& share) {
        const float loss = share_step(reference, share);
        training.scaler().unscale_gradients(reference.parameters());  // fp16: as the run unscales
        return loss;
      });
  if (o.faults.fault == "adamw-decay")  // the class's slip is the reference's replay's too
    dynamic_cast<optim::Adam&>(check->reference_recipe().optimizer()).break_decoupled_decay_from(o.faults.from_step + 1);
  return check;
}

}  // namespace course::chapter04
