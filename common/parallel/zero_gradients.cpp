// ZeRO stage 2: the gradients sharded too. Each unit's gradients are reduce-scattered during backward,
// as soon as the unit is complete (overlapped with the rest of backward), and only this rank's part is
// kept: the whole gradients never exist at once.
#include <stdexcept>

#include "common/autograd/autograd.h"
#include "common/core/memory.h"
#include "common/kernels/kernels.h"
#include "common/parallel/zero.h"

namespace course::parallel {

void ZeroOptimizer::on_gradient_ready(std::size_t i) {
  complete_finished_units(false);  // free what has arrived, so only the units in flight hold memory
  const std::size_t u = layout_.unit_of(i);
  const FlatUnit& unit = layout_.units()[u];
  PendingUnit& pending = pending_[u];
  if (pending.work) complete_unit(u);  // the previous pass's reduction of this unit (accumulation)
  Tensor& p = params_[i];
  if (!pending.buffer.defined()) {
    MemoryCategoryScope scope(MemoryCategory::communication);
    pending.buffer = Tensor::zeros({unit.padded}, p.device(), p.dtype());
    pending.missing = unit.params.size();
  }
  const Tensor grad = p.grad();
  pending.buffer.flat_view(static_cast<std::size_t>(layout_.offset_of(i) - unit.offset), static_cast<std::size_t>(grad.numel()))
      .copy_from(grad);
  p.set_grad(Tensor());  // freed now: the whole model's gradients never exist at once
  if (--pending.missing == 0) {
    reduce_unit_async(u);
    if (options_.stage == 3 && u != root_unit_) release_unit(u);  // its backward is done: reshard
  }
}

void ZeroOptimizer::reduce_unit_async(std::size_t u) {
  PendingUnit& pending = pending_[u];
  MemoryCategoryScope scope(MemoryCategory::communication);
  pending.reduced = Tensor::empty({layout_.units()[u].part}, pending.buffer.device(), pending.buffer.dtype());
  pending.work = group_.reduce_scatter_async(pending.buffer, pending.reduced, comm::ReduceOp::average);
  count_ring(comm::OpKind::reduce_scatter, pending.buffer.nbytes());
  in_flight_.push_back(u);
  // Double buffering, as DeepSpeed's reduce buckets: with more than two units in flight, wait for the
  // oldest, so the gradients held beyond the shard stay about two units whatever the model's size.
  while (in_flight_.size() > kMaxUnitsInFlight) {
    const std::size_t oldest = in_flight_.front();
    if (pending_[oldest].work) complete_unit(oldest);
    else in_flight_.pop_front();
  }
}

// Waits for unit u's reduce-scatter, adds this rank's part into its gradient shard (passes accumulate;
// on the host when offloaded), and frees the unit's buffers.
void ZeroOptimizer::complete_unit(std::size_t u) {
  PendingUnit& pending = pending_[u];
  pending.work->wait();
  Tensor mine = grad_shard_.flat_view(static_cast<std::size_t>(layout_.units()[u].shard_offset),
                                      static_cast<std::size_t>(layout_.units()[u].part));
  Tensor reduced = pending.reduced;
  if (offloaded()) {  // ZeRO-Offload: this rank's part goes down to the host, during backward
    host_.down += static_cast<std::int64_t>(reduced.nbytes());
    if (reduced.device() != mine.device()) {
      MemoryCategoryScope scope(MemoryCategory::offloaded);
      reduced = reduced.to(mine.device());
    }
  }
  mine.add_(reduced);  // 16-bit shards: added in float32, rounded once
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

}  // namespace course::parallel
