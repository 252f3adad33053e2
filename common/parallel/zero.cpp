// ZeRO stages 0-2: the flat buffers, the reductions, clipping on shards, the sharded AdamW update and
// the parameters' all-gather.
#include "common/parallel/zero.h"

#include <cmath>
#include <stdexcept>

#include "common/autograd/autograd.h"
#include "common/core/memory.h"
#include "common/kernels/kernels.h"

namespace course::parallel {
namespace {

std::int64_t cap_elements(double megabytes) {
  return std::max<std::int64_t>(1, static_cast<std::int64_t>(megabytes * 1024.0 * 1024.0 / sizeof(float)));
}

}  // namespace

ZeroOptimizer::ZeroOptimizer(nn::Module& model, comm::Communicator& group, ZeroOptions options)
    : group_(group),
      options_(options),
      params_(model.parameters()),
      layout_(params_, options.stage == 0 ? 1 : group.size(), cap_elements(options.unit_cap_mb)) {
  if (options_.stage < 0 || options_.stage > 2)
    throw std::invalid_argument("ZeroOptimizer: stage " + std::to_string(options_.stage) + " is not 0, 1 or 2");
  if (params_.empty()) throw std::invalid_argument("ZeroOptimizer: the model has no parameters");
  const Device device = params_.front().device();

  // The parameters move into one flat buffer; the model's tensors become views into it.
  {
    MemoryCategoryScope scope(MemoryCategory::parameters);
    flat_params_ = Tensor::zeros({layout_.padded()}, device);
  }
  for (std::size_t i = 0; i < params_.size(); ++i) {
    Tensor& p = params_[i];
    const auto offset = static_cast<std::size_t>(layout_.offset_of(i));
    flat_params_.view(offset, p.shape()).copy_from(p);
    p.impl()->storage = flat_params_.impl()->storage;
    p.impl()->offset = flat_params_.impl()->offset + offset;
    weight_decay_.push_back(p.shape().size() >= 2 ? options_.weight_decay : 0.0f);
  }
  group_.broadcast(flat_params_, 0);  // every rank starts from rank 0's values, as DDP

  if (options_.stage <= 1) {
    MemoryCategoryScope scope(MemoryCategory::gradients);
    flat_grads_ = Tensor::zeros({layout_.padded()}, device);
    for (std::size_t i = 0; i < params_.size(); ++i)
      params_[i].set_grad(flat_grads_.view(static_cast<std::size_t>(layout_.offset_of(i)), params_[i].shape()));
  }
  if (options_.stage >= 1) {
    // Stage 1: the reduce-scatter's output, a communication buffer. Stage 2: the only gradient kept.
    MemoryCategoryScope scope(options_.stage == 1 ? MemoryCategory::communication : MemoryCategory::gradients);
    grad_shard_ = Tensor::zeros({layout_.shard()}, device);
  }
  {
    MemoryCategoryScope scope(MemoryCategory::optimizer_state);
    const std::int64_t n = options_.stage == 0 ? layout_.padded() : layout_.shard();
    exp_avg_ = Tensor::zeros({n}, device);
    exp_avg_sq_ = Tensor::zeros({n}, device);
  }
  if (options_.stage == 2) {
    pending_.resize(layout_.units().size());
    for (std::size_t i = 0; i < params_.size(); ++i) {
      params_[i].set_grad(Tensor());
      // A parameter's own gradient lives only until it is copied into its unit's buffer: a
      // communication buffer in ZeRO's accounting, not a gradient kept.
      params_[i].impl()->grad_category = MemoryCategory::communication;
      params_[i].register_post_accumulate_grad_hook([this, i](Tensor&) { on_gradient_ready(i); });
    }
  }
  bytes_at_last_step_ = group_.bytes_sent();
}

Tensor ZeroOptimizer::part_of(const Tensor& buffer, std::size_t unit) const {
  const FlatUnit& u = layout_.units()[unit];
  return buffer.flat_view(static_cast<std::size_t>(group_.rank() * u.part), static_cast<std::size_t>(u.part));
}

void ZeroOptimizer::on_gradient_ready(std::size_t i) {
  complete_finished_units(false);  // free what has arrived, so only the units in flight hold memory
  const std::size_t u = layout_.unit_of(i);
  const FlatUnit& unit = layout_.units()[u];
  PendingUnit& pending = pending_[u];
  if (pending.work) complete_unit(u);  // the previous pass's reduction of this unit (accumulation)
  Tensor& p = params_[i];
  if (!pending.buffer.defined()) {
    MemoryCategoryScope scope(MemoryCategory::communication);
    pending.buffer = Tensor::zeros({unit.padded}, p.device());
    pending.missing = unit.params.size();
  }
  Tensor grad = p.grad();
  kernels(p.device()).copy(pending.buffer.data() + (layout_.offset_of(i) - unit.offset), grad.data(),
                           static_cast<std::size_t>(grad.numel()));
  p.set_grad(Tensor());  // freed now: the whole model's gradients never exist at once
  if (--pending.missing == 0) reduce_unit_async(u);
}

void ZeroOptimizer::reduce_unit_async(std::size_t u) {
  PendingUnit& pending = pending_[u];
  MemoryCategoryScope scope(MemoryCategory::communication);
  pending.reduced = Tensor::empty({layout_.units()[u].part}, pending.buffer.device());
  pending.work = group_.reduce_scatter_async(pending.buffer, pending.reduced, comm::ReduceOp::average);
  in_flight_.push_back(u);
  // Double buffering, as DeepSpeed's reduce buckets: with more than two units in flight, wait for the
  // oldest, so the gradients held beyond the shard stay about two units whatever the model's size.
  while (in_flight_.size() > kMaxUnitsInFlight) {
    const std::size_t oldest = in_flight_.front();
    if (pending_[oldest].work) complete_unit(oldest);
    else in_flight_.pop_front();
  }
}

// Waits for unit u's reduce-scatter, adds this rank's part into its gradient shard (passes accumulate),
// and frees the unit's buffers.
void ZeroOptimizer::complete_unit(std::size_t u) {
  PendingUnit& pending = pending_[u];
  pending.work->wait();
  Tensor mine = grad_shard_.flat_view(static_cast<std::size_t>(layout_.units()[u].shard_offset),
                                      static_cast<std::size_t>(layout_.units()[u].part));
  kernels(mine.device()).binary(BinaryOp::add, mine.data(), static_cast<std::size_t>(mine.numel()),
                                pending.reduced.data(), static_cast<std::size_t>(mine.numel()), mine.data(),
                                static_cast<std::size_t>(mine.numel()));
  pending = PendingUnit{};
  for (auto it = in_flight_.begin(); it != in_flight_.end(); ++it)
    if (*it == u) {
      in_flight_.erase(it);
      break;
    }
}

void ZeroOptimizer::complete_finished_units(bool all) {
  for (std::size_t u = 0; u < pending_.size(); ++u)
    if (pending_[u].work && (all || pending_[u].work->test())) complete_unit(u);
}

void ZeroOptimizer::finish_reductions() {
  // Units some of whose parameters had no gradient this pass are reduced now, in unit order on every rank.
  for (std::size_t u = 0; u < pending_.size(); ++u)
    if (pending_[u].buffer.defined() && !pending_[u].work) reduce_unit_async(u);  // keeps the buffer until done
  complete_finished_units(true);
}

double ZeroOptimizer::step() {
  autograd::NoGradGuard no_grad;
  if (options_.stage == 0) {
    if (group_.size() > 1) group_.all_reduce(flat_grads_, comm::ReduceOp::average);
  } else if (options_.stage == 1) {
    for (std::size_t u = 0; u < layout_.units().size(); ++u) {
      const FlatUnit& unit = layout_.units()[u];
      Tensor whole = flat_grads_.flat_view(static_cast<std::size_t>(unit.offset), static_cast<std::size_t>(unit.padded));
      Tensor mine = grad_shard_.flat_view(static_cast<std::size_t>(unit.shard_offset), static_cast<std::size_t>(unit.part));
      group_.reduce_scatter(whole, mine, comm::ReduceOp::average);
    }
  } else {
    finish_reductions();
  }
  const double norm = clip();
  update();
  gather_parameters();
  bytes_last_step_ = group_.bytes_sent() - bytes_at_last_step_;
  bytes_at_last_step_ = group_.bytes_sent();
  return norm;
}

// torch.nn.utils.clip_grad_norm_ over the whole model's averaged gradient, from the shards: each rank
// sums the squares of what it holds (in double) and the sums are all-reduced.
double ZeroOptimizer::clip() {
  if (options_.max_grad_norm <= 0) return 0;
  const Tensor& held = options_.stage == 0 ? flat_grads_ : grad_shard_;
  double squares = 0;
  for (float g : held.to_host()) squares += static_cast<double>(g) * g;
  if (options_.stage > 0 && group_.size() > 1) {
    Tensor total = Tensor::from_host({static_cast<float>(squares)}, {1}, held.device());
    group_.all_reduce(total, comm::ReduceOp::sum);
    squares = total.item();
  }
  const double norm = std::sqrt(squares);
  const double coefficient = options_.max_grad_norm / (norm + 1e-6);
  if (coefficient < 1.0) {
    Tensor scaled = held;
    kernels(held.device()).scale(held.data(), static_cast<float>(coefficient), scaled.data(),
                                 static_cast<std::size_t>(held.numel()));
  }
  return norm;
}

// AdamW on the pieces of parameters this rank owns: every element is updated by exactly one rank (all
// of them at stage 0) with the same arithmetic as optim::Adam.
void ZeroOptimizer::update() {
  ++steps_;
  AdamParams a{options_.lr, options_.beta1, options_.beta2, options_.eps, 0.0f, true,
               static_cast<float>(1.0 - std::pow(static_cast<double>(options_.beta1), steps_)),
               static_cast<float>(1.0 - std::pow(static_cast<double>(options_.beta2), steps_))};
  const int me = options_.stage == 0 ? 0 : group_.rank();
  const Tensor& grads = options_.stage == 0 ? flat_grads_ : grad_shard_;
  Kernels& k = kernels(flat_params_.device());
  for (std::size_t u = 0; u < layout_.units().size(); ++u) {
    const FlatUnit& unit = layout_.units()[u];
    for (const FlatSegment& s : layout_.segments(u, me)) {
      const std::int64_t flat = unit.offset + me * unit.part + s.part_offset, shard = unit.shard_offset + s.part_offset;
      a.weight_decay = weight_decay_[s.param];
      k.adam_step(flat_params_.data() + flat, grads.data() + shard, exp_avg_.data() + shard,
                  exp_avg_sq_.data() + shard, static_cast<std::size_t>(s.length), a);
    }
  }
}

void ZeroOptimizer::gather_parameters() {
  if (options_.stage == 0 || group_.size() == 1) return;
  for (std::size_t u = 0; u < layout_.units().size(); ++u) {
    const FlatUnit& unit = layout_.units()[u];
    Tensor whole = flat_params_.flat_view(static_cast<std::size_t>(unit.offset), static_cast<std::size_t>(unit.padded));
    MemoryCategoryScope scope(MemoryCategory::communication);
    Tensor mine = part_of(whole, u).clone();  // the input may not alias the output
    group_.all_gather(mine, whole);
  }
}

void ZeroOptimizer::zero_grad() {
  if (flat_grads_.defined()) flat_grads_.fill_(0.0f);
  if (options_.stage == 2) grad_shard_.fill_(0.0f);
}

}  // namespace course::parallel
