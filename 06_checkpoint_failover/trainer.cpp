// Chapter 06's data-parallel step and its optimizer.
#include "06_checkpoint_failover/trainer.h"

#include <sstream>

#include "common/comm/agree.h"  // all_reduce_scalar
#include "common/nn/gpt.h"
#include "common/parallel/distributed_sampler.h"

namespace course::chapter06 {
checkpoint::RunIdentity run_identity(const Options& o, const nn::TrainingTask& task, const nn::Module& model,
                                     std::int64_t global_batch) {
  std::ostringstream s;
  if (o.models.model == "mlp") {
    s << R"({"model":"mlp","features":)" << o.mlp.features << R"(,"hidden":)" << o.mlp.hidden << R"(,"layers":)" << o.mlp.layers
      << R"(,"outputs":1,"activation":"relu")";
  } else {
    s << R"({"model":"gpt","gpt":)" << dynamic_cast<const nn::GPT&>(model).config().to_json()
      << R"(,"schedule_steps":)" << o.training.steps;
  }
  s << R"(,"data":")" << task.description << R"(")";
  // A run in another precision rounds differently and, in fp16, carries a loss scale: another run.
  if (o.precision.precision != "fp32") s << R"(,"precision":")" << o.precision.precision << R"(")";
  s << "}";
  return {s.str(), o.common.seed, global_batch, o.training.steps, o.checkpoints.every};
}


Trainer::Trainer(const Options& o, const nn::TrainingTask& task, comm::Communicator& group) {
  model = task.make_model(o.common.seed + static_cast<std::uint64_t>(group.rank()));
  parallel::ReducerOptions reduce;
  reduce.reduce_dtype = o.precision.reduce();  // --reduce-dtype: gradients averaged in 16 bits
  ddp = std::make_unique<parallel::DistributedDataParallel>(model, group, reduce);
  recipe = std::make_unique<optim::Recipe>(
      model->parameters(),
      optim::RecipeOptions{.name = recipe_of(o), .lr = o.training.lr, .total_steps = o.training.steps,
                           .precision = o.precision.dtype(), .loss_scale = o.precision.loss_scale},
      &group);
}

float Trainer::forward_backward(const nn::TrainingTask& task, const data::SampleStream& stream, std::int64_t position,
                                std::int64_t global_batch, comm::Communicator& group) {
  share = parallel::DistributedSampler::share_of(stream.take(position, global_batch), group.rank(), group.size());
  const Tensor loss = recipe->forward_backward([&] { return task.loss(*model, share); });  // DDP averages in backward
  return comm::all_reduce_scalar(group, loss.item(), comm::ReduceOp::average);  // the ranks' mean
}

double Trainer::update(std::int64_t step) { return optim::norm_value(recipe->step(step)); }

std::vector<float> Trainer::optimizer_state_to_host() const {
  std::vector<float> all;
  for (const auto& [name, t] : recipe->optimizer().state()) {
    auto v = t.to_host();
    all.insert(all.end(), v.begin(), v.end());
  }
  return all;
}

}  // namespace course::chapter06
