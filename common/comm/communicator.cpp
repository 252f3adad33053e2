// Argument checks, sequence numbers and the watchdog, shared by every backend.
#include "common/comm/communicator.h"

#include <stdexcept>

#include "common/comm/watchdog.h"

namespace course::comm {

const char* reduce_op_name(ReduceOp op) {
  return op == ReduceOp::sum ? "sum" : op == ReduceOp::average ? "average" : "max";
}

const char* op_name(OpKind kind) {
  switch (kind) {
    case OpKind::broadcast: return "broadcast";
    case OpKind::reduce: return "reduce";
    case OpKind::all_reduce: return "all_reduce";
    case OpKind::all_gather: return "all_gather";
    case OpKind::reduce_scatter: return "reduce_scatter";
    case OpKind::scatter: return "scatter";
    case OpKind::gather: return "gather";
    case OpKind::barrier: return "barrier";
    case OpKind::send: return "send";
    case OpKind::recv: return "recv";
    case OpKind::send_recv: return "send_recv";
    case OpKind::all_to_all: return "all_to_all";
  }
  return "unknown";
}

namespace {
class CompletedWork final : public Work {
 public:
  void wait() override {}
  bool test() override { return true; }
};
}  // namespace

WorkHandle completed_work() { return std::make_shared<CompletedWork>(); }

namespace {
// Completes the backend's work, then tells the watchdog; wait() is idempotent.
class WatchedWork final : public Work {
 public:
  WatchedWork(WorkHandle inner, std::uint64_t id) : inner_(std::move(inner)), id_(id) {}
  ~WatchedWork() override {
    if (!done_) watchdog_end(id_);  // dropped without waiting: stop watching, the backend still completes it
  }
  void wait() override {
    if (done_) return;
    inner_->wait();
    finish();
  }
  bool test() override {
    if (done_) return true;
    if (!inner_->test()) return false;
    finish();
    return true;
  }

 private:
  void finish() {
    done_ = true;
    watchdog_end(id_);
  }
  WorkHandle inner_;
  std::uint64_t id_;
  bool done_ = false;
};

void check_count(const Tensor& big, const Tensor& small, int ranks, const char* what) {
  if (big.dtype() != small.dtype())
    throw std::invalid_argument(std::string(what) + ": the tensors hold " + dtype_name(big.dtype()) + " and " +
                                dtype_name(small.dtype()) + "; both must have one element type");
  if (big.numel() != small.numel() * ranks)
    throw std::invalid_argument(std::string(what) + ": the larger tensor must hold " + std::to_string(ranks) +
                                " x " + std::to_string(small.numel()) + " elements, it holds " +
                                std::to_string(big.numel()));
}
}  // namespace

void Communicator::check_root(int root, const char* what) const {
  if (root < 0 || root >= size())
    throw std::invalid_argument(std::string(what) + ": root " + std::to_string(root) + " is out of range for " +
                                std::to_string(size()) + " ranks");
}
void Communicator::check_peer(int peer, const char* what) const {
  if (peer < 0 || peer >= size())
    throw std::invalid_argument(std::string(what) + ": peer " + std::to_string(peer) + " is out of range for " +
                                std::to_string(size()) + " ranks");
}

void Communicator::set_timeout(std::chrono::milliseconds timeout) {
  if (timeout.count() <= 0 || timeout.count() > static_cast<long>(kMaxTimeoutSeconds * 1000))
    throw std::invalid_argument("collective timeout of " + std::to_string(timeout.count()) +
                                " ms is outside (0, kMaxTimeoutSeconds]");
  timeout_ = timeout;
}

std::unique_ptr<Communicator> Communicator::split(int color, int key) {
  std::unique_ptr<Communicator> group = split_group(color, key);
  group->timeout_ = timeout_;
  group->ring_order_ = ring_order_;  // a part of a group that adds in the ring's order does too
  // Which machine each member is on, gathered across the new group (node ids are world ranks, exact
  // in a float): the local rank counts the members on my machine before me.
  Tensor mine = Tensor::from_host({static_cast<float>(placement_.node)}, {1});
  Tensor nodes = Tensor::zeros({group->size()});
  group->all_gather(mine, nodes);
  auto all = nodes.to_host();
  Placement& p = group->placement_;
  p.node = placement_.node;
  p.local_rank = 0;
  p.local_size = 0;
  for (int r = 0; r < group->size(); ++r) {
    if (all[static_cast<std::size_t>(r)] != mine.item()) continue;
    ++p.local_size;
    if (r < p.rank) ++p.local_rank;
  }
  return group;
}

WorkHandle Communicator::submit(Collective c) {
  c.ring_order = ring_order_;
  if (c.kind != OpKind::recv && c.input.defined()) bytes_sent_ += static_cast<std::int64_t>(c.input.nbytes());
  long sequence = ++sequence_;
  std::uint64_t id = watchdog_begin(op_name(c.kind), sequence, rank(), timeout_);
  try {
    if (consistency_checks()) check_consistency(c);
    return std::make_shared<WatchedWork>(start(c), id);
  } catch (...) {
    watchdog_end(id);
    throw;
  }
}

WorkHandle Communicator::broadcast_async(Tensor& t, int root) {
  check_root(root, "broadcast");
  return submit({OpKind::broadcast, t, t, root});
}
WorkHandle Communicator::reduce_async(Tensor& t, int root, ReduceOp op) {
  check_root(root, "reduce");
  return submit({OpKind::reduce, t, t, root, 0, 0, op});
}
WorkHandle Communicator::all_reduce_async(Tensor& t, ReduceOp op) {
  return submit({OpKind::all_reduce, t, t, 0, 0, 0, op});
}
WorkHandle Communicator::all_reduce_async(Tensor& packed, ReduceOp op, Element element) {
  if (element != Element::float32 && op != ReduceOp::sum)
    throw std::invalid_argument("all_reduce: 16-bit buffers support the sum only");
  if (element != Element::float32 && packed.dtype() != DType::float32)
    throw std::invalid_argument("all_reduce: packed 16-bit values travel in a float32 buffer");
  return submit({OpKind::all_reduce, packed, packed, 0, 0, 0, op, element});
}
WorkHandle Communicator::all_gather_async(const Tensor& input, Tensor& output) {
  check_count(output, input, size(), "all_gather");
  return submit({OpKind::all_gather, input, output});
}
WorkHandle Communicator::reduce_scatter_async(const Tensor& input, Tensor& output, ReduceOp op) {
  check_count(input, output, size(), "reduce_scatter");
  return submit({OpKind::reduce_scatter, input, output, 0, 0, 0, op});
}
WorkHandle Communicator::all_to_all_async(const Tensor& input, Tensor& output) {
  check_count(input, output, 1, "all_to_all");
  if (input.numel() % size() != 0)
    throw std::invalid_argument("all_to_all: " + std::to_string(input.numel()) + " elements do not split into " +
                                std::to_string(size()) + " equal slices");
  return submit({OpKind::all_to_all, input, output});
}
WorkHandle Communicator::scatter_async(const Tensor& input, Tensor& output, int root) {
  check_root(root, "scatter");
  if (rank() == root) check_count(input, output, size(), "scatter");
  return submit({OpKind::scatter, input, output, root});
}
WorkHandle Communicator::gather_async(const Tensor& input, Tensor& output, int root) {
  check_root(root, "gather");
  if (rank() == root) check_count(output, input, size(), "gather");
  return submit({OpKind::gather, input, output, root});
}
WorkHandle Communicator::barrier_async() {
  Collective c{OpKind::barrier, Tensor(), Tensor()};
  return submit(c);
}

WorkHandle Communicator::send_async(const Tensor& t, int dst, int tag) {
  check_peer(dst, "send");
  return submit({OpKind::send, t, Tensor(), dst, 0, tag});
}
WorkHandle Communicator::recv_async(Tensor& t, int src, int tag) {
  check_peer(src, "recv");
  return submit({OpKind::recv, Tensor(), t, 0, src, tag});
}
void Communicator::send_recv(const Tensor& send, int dst, Tensor& recv, int src, int tag) {
  check_peer(dst, "send_recv");
  if (send.dtype() != recv.dtype())
    throw std::invalid_argument(std::string("send_recv: sends ") + dtype_name(send.dtype()) + " and receives " +
                                dtype_name(recv.dtype()) + "; both must have one element type");
  check_peer(src, "send_recv");
  submit({OpKind::send_recv, send, recv, dst, src, tag})->wait();
}

}  // namespace course::comm
