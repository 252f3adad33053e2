// Chapter 05's lock-step check and its bucket faults.
#include "05_bucketing_overlap/checks.h"

#include <bit>
#include <cstdint>

#include "common/comm/agree.h"  // all_reduce_scalar

namespace course::chapter05 {

StepChecks::StepChecks(const Options& o, const nn::TrainingTask& task, comm::Communicator& group,
                       const parallel::DistributedSampler& sampler, std::int64_t local_batch,
                       const optim::Recipe& training, const nn::Module& model)
    : task_(task), group_(group), sampler_(sampler), local_batch_(local_batch), training_(training), model_(model) {
  auto reference = verify::make_reference([&] { return task.make_model(o.common.seed); });
  reference_sgd_ = std::make_unique<optim::SGD>(reference->parameters(), o.training.lr);
  lockstep_ = std::make_unique<verify::Lockstep>(reference, [this](std::int64_t) {
    reference_sgd_->step();
    reference_sgd_->zero_grad();
  }, &group);
  lockstep_->set_optimizer(*reference_sgd_);  // and SGD's formula itself
  // A 16-bit hook adds in 16 bits: the bound follows its unit roundoff (common/verify/compare.h).
  if (o.comm_hook == "fp16") lockstep_->set_rounding(verify::kFloat16Rounding);
  if (o.comm_hook == "bf16") lockstep_->set_rounding(verify::kBfloat16Rounding);
}

void StepChecks::on_begin_step(std::int64_t step) { lockstep_->begin_step(step, model_); }

void StepChecks::on_check_gradient(std::int64_t step, float local_loss) {
  const float global_loss = comm::all_reduce_scalar(group_, local_loss, comm::ReduceOp::average);
  const int ranks = group_.size();
  const auto global = sampler_.global_batch(step, local_batch_);
  lockstep_->set_loss_scale(training_.scaler().get_scale());  // fp16: the parts a 16-bit hook adds carried it
  lockstep_->check_parts(step, model_, global_loss, static_cast<std::size_t>(ranks), 1.0 / ranks,
                         [&](nn::Module& reference, std::size_t r) {
                           const auto theirs = parallel::DistributedSampler::share_of(global, static_cast<int>(r), ranks);
                           // In the run's precision, its loss scale undone as the run undoes it.
                           return training_.reference_backward(reference.parameters(),
                                                               [&] { return task_.loss(reference, theirs); });
                         });
}

void StepChecks::on_check_update(std::int64_t step, double) { lockstep_->check_update(step); }

verify::LockstepSummary StepChecks::on_finish() { return lockstep_->finish(model_); }

parallel::CommHook with_fault(const cli::FaultOptions& faults, parallel::CommHook inner,
                              std::function<Messages()> messages, const std::int64_t& step, std::size_t& launched) {
  if (faults.fault == "none") return inner;
  return [&faults, inner, messages, &step, &launched](comm::Communicator& group, Tensor& buffer) {
    const std::size_t b = launched++;
    const Messages layout = messages();
    if (faults.at("skip-bucket", step) && b == 0) return comm::completed_work();  // never all-reduced
    if (faults.at("launch-early", step) && b == 0) {
      // Launched before its last gradient was in: the all-reduce averages the rest, and that gradient
      // lands afterwards, this rank's own.
      const std::size_t late = layout.first_last_offset, n = static_cast<std::size_t>(buffer.numel()) - late;
      Tensor own = buffer.flat_view(late, n).clone();
      inner(group, buffer)->wait();
      buffer.flat_view(late, n).copy_from(own);
      return comm::completed_work();
    }
    if (faults.at("step-early", step) && b + 1 == layout.count) {
      // The optimizer steps before the last message's average lands: it reads this rank's own gradients.
      Tensor copy = buffer.clone();
      inner(group, copy)->wait();
      return comm::completed_work();
    }
    if (faults.at("truncating-hook", step)) {
      // The hook's division by the ranks, then a conversion to bf16 that drops the low 16 bits. Multiplied
      // back by the ranks (exact: 8 significant bits times a small integer fit in float32), the hook's own
      // division and its conversion to the nearest bf16 give those truncated values back.
      const auto ranks = static_cast<float>(group.size());
      std::vector<float> values = buffer.to_host();
      for (float& v : values) v = std::bit_cast<float>(std::bit_cast<std::uint32_t>(v / ranks) & 0xffff0000u) * ranks;
      buffer.copy_from(Tensor::from_host(values, buffer.shape(), buffer.device()));
    }
    return inner(group, buffer);
  };
}

}  // namespace course::chapter05
