// The lock-step check of a ZeRO run against the whole model.
#include "07_zero/verify_zero.h"

#include "common/core/memory.h"
#include "common/data/sampling.h"
#include "common/ops/ops.h"
#include "common/verify/data_order.h"

namespace course::chapter07 {

ZeroCheck::ZeroCheck(const nn::TrainingTask& task, parallel::ZeroOptimizer& zero, const parallel::ZeroOptions& options,
                     const parallel::DistributedSampler& sampler, comm::Communicator& group, std::uint64_t seed,
                     std::int64_t global_batch, int accum, std::int64_t first_step)
    : task_(task), zero_(zero), group_(group), sampler_(sampler), global_batch_(global_batch), accum_(accum) {
  reference_ = verify::make_reference([&] { return task.make_model(seed); });
  if (zero.options().precision != DType::float32) {
    working_ = verify::make_reference([&] {
      auto model = task.make_model(seed);
      model->to(zero.options().precision);
      return model;
    });
  }
  adam_ = std::make_unique<optim::Adam>(optim::weight_decay_groups(reference_->parameters(), options.weight_decay),
                                        options.lr, options.beta1, options.beta2, options.eps, true);
  if (first_step > 0) start_from_resumed();
  check_ = std::make_unique<verify::Lockstep>(reference_, [this](std::int64_t) {
    adam_->step();
    adam_->zero_grad();
  }, &group, options.max_grad_norm);
  check_->set_rounding(verify::rounding_of(zero.options().precision));  // the run adds its parts in its type
  check_->set_optimizer(*adam_);  // and AdamW's formula itself
  check_->emulate_half_kernels();  // its 16-bit copy's parts again, without a 16-bit kernel (on_check_gradient)
}

void ZeroCheck::on_check_update(std::int64_t step, double norm) { check_->check_update(step, norm); }

verify::LockstepSummary ZeroCheck::on_finish() {
  const std::vector<float> whole = zero_.full_parameters();
  check_->check_replicas(check_->next_step(), whole, group_);
  return check_->finish(whole);
}

void ZeroCheck::on_begin_step(std::int64_t step) {
  // Every rank's whole parameters (gathered from the shards, or held whole below stage 3): rank 0's against
  // the prediction, every other rank's against rank 0's.
  const std::vector<float> whole = zero_.full_parameters();
  check_->begin_step(step, whole);
  check_->check_replicas(step, whole, group_);
  if (working_) {
    MemoryCategoryOverride verification(MemoryCategory::verification);
    working_->load_parameters_from_host(reference_->parameters_to_host());  // rounded to 16 bits
  }
}

float ZeroCheck::part(nn::Module& reference, const std::vector<std::int64_t>& batch, float weight) {
  if (!working_) {
    Tensor l = scale(task_.loss(reference, batch), weight);
    l.backward();
    return l.item();
  }
  working_->zero_grad();
  // The run's forward under autocast and backward from the scaled loss (its precision policy).
  const Tensor l = zero_.mixed_precision().forward_backward([&] { return scale(task_.loss(*working_, batch), weight); });
  // The 16-bit gradients, widened and unscaled (the scale a power of two: exact), as the masters'.
  const float inverse = 1.0f / zero_.scaler().get_scale();
  const auto masters = reference.parameters(), working = working_->parameters();
  for (std::size_t i = 0; i < masters.size(); ++i) {
    std::vector<float> g = working[i].grad().defined() ? working[i].grad().to_host()
                                                       : std::vector<float>(static_cast<std::size_t>(working[i].numel()), 0.0f);
    for (float& v : g) v *= inverse;
    Tensor master = masters[i];
    master.set_grad(Tensor::from_host(g, master.shape(), master.device()));
  }
  return l.item();
}

void ZeroCheck::on_check_gradient(std::int64_t step, float loss) {
  MemoryCategoryOverride verification(MemoryCategory::verification);  // the gathered copies are the check's
  const int ranks = sampler_.num_replicas();
  const std::int64_t local_batch = global_batch_ / ranks;
  const auto global = sampler_.global_batch(step, local_batch);
  // What the ranks trained on (the loop's sampler.batch), held against the global batch alone: the
  // reference cuts its parts with share_of below, so a bug the sampler's two cuts share fails here.
  const std::string wrong = verify::check_data_order(group_, sampler_.batch(step, local_batch), global);
  if (!wrong.empty()) check_->record(step, "the data order: " + wrong);
  const auto micro_of = [&](int rank) {
    return data::split_batches(parallel::DistributedSampler::share_of(global, rank, ranks),
                               (local_batch + accum_ - 1) / accum_);
  };
  const std::size_t per_rank = micro_of(0).size();
  check_->set_loss_scale(zero_.scaler().get_scale());  // fp16: the run added its parts so scaled
  // Part i is micro-batch i / ranks of rank i % ranks, so each rank recomputes its own.
  const auto part_of = [&](nn::Module& reference, std::size_t i) {
    const int rank = static_cast<int>(i % static_cast<std::size_t>(ranks));
    const auto micro = micro_of(rank);
    const auto& batch = micro[i / static_cast<std::size_t>(ranks)];
    const auto share = parallel::DistributedSampler::share_of(global, rank, ranks);
    return part(reference, batch, static_cast<float>(batch.size()) / static_cast<float>(share.size()));
  };
  const std::size_t parts = per_rank * static_cast<std::size_t>(ranks);
  check_->check_parts(step, zero_.full_gradients(), loss, parts, 1.0 / ranks, part_of);
  // In 16 bits those parts ran the 16-bit kernels, as the run did: the same parts again without them, whose
  // bits they must be on the CPU, so that a bug in a 16-bit kernel fails here (--fault truncating-gelu).
  if (working_ && working_->parameters().front().device() == Device::cpu)
    check_->check_emulated(step, parts, 1.0 / ranks, part_of);
}

void ZeroCheck::start_from_resumed() {
  MemoryCategoryOverride verification(MemoryCategory::verification);
  reference_->load_parameters_from_host(zero_.full_parameters());
  const auto state = zero_.full_optimizer_state();
  // The run's moments are in registration order; the reference's AdamW holds its parameters group by group.
  const auto order = reference_->parameters();
  std::vector<std::pair<std::string, Tensor>> named;
  const auto& params = adam_->params();
  for (std::size_t k = 0; k < params.size(); ++k) {
    std::size_t offset = 0;
    for (const Tensor& p : order) {
      if (p.impl() == params[k].impl()) break;
      offset += static_cast<std::size_t>(p.numel());
    }
    const auto n = static_cast<long>(params[k].numel());
    const auto at = static_cast<long>(offset);
    named.emplace_back(std::to_string(k) + ".exp_avg",
                       Tensor::from_host({state.exp_avg.begin() + at, state.exp_avg.begin() + at + n}, params[k].shape(),
                                         params[k].device()));
    named.emplace_back(std::to_string(k) + ".exp_avg_sq",
                       Tensor::from_host({state.exp_avg_sq.begin() + at, state.exp_avg_sq.begin() + at + n},
                                         params[k].shape(), params[k].device()));
  }
  adam_->load_state(named, zero_.steps_taken());
}

}  // namespace course::chapter07
