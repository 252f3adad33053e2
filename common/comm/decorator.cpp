// Forwarding every operation to the wrapped communicator.
#include "common/comm/decorator.h"

namespace course::comm {

CommunicatorDecorator::CommunicatorDecorator(std::unique_ptr<Communicator> inner)
    : Communicator(inner->placement()), inner_(std::move(inner)) {
  set_timeout(inner_->timeout());
  if (inner_->adds_in_ring_order()) add_in_ring_order();
}

WorkHandle CommunicatorDecorator::forward(const Collective& c) {
  Tensor in = c.input, out = c.output;
  switch (c.kind) {
    case OpKind::broadcast: return inner_->broadcast_async(out, c.root);
    case OpKind::reduce: return inner_->reduce_async(out, c.root, c.op);
    case OpKind::all_reduce: return inner_->all_reduce_async(out, c.op, c.element);
    case OpKind::all_gather: return inner_->all_gather_async(in, out);
    case OpKind::reduce_scatter: return inner_->reduce_scatter_async(in, out, c.op);
    case OpKind::scatter: return inner_->scatter_async(in, out, c.root);
    case OpKind::gather: return inner_->gather_async(in, out, c.root);
    case OpKind::barrier: return inner_->barrier_async();
    case OpKind::send: return inner_->send_async(in, c.root, c.tag);
    case OpKind::recv: return inner_->recv_async(out, c.peer, c.tag);
    case OpKind::send_recv: inner_->send_recv(in, c.root, out, c.peer, c.tag); return completed_work();
    case OpKind::all_to_all: return inner_->all_to_all_async(in, out);
  }
  return completed_work();
}

}  // namespace course::comm
