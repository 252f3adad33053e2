// Naive, binomial-tree and ring collectives over Communicator::send/recv/send_recv.
#include "common/comm/algorithms.h"

#include <algorithm>
#include <functional>
#include <vector>
#include <stdexcept>

#include "common/kernels/kernels.h"

namespace course::comm::algorithms {
namespace {

// out = a op b, elementwise (out may be a or b).
void reduce_into(Tensor& out, const Tensor& a, const Tensor& b, ReduceOp op) {
  auto n = static_cast<std::size_t>(out.numel());
  kernels(out.device()).binary(op == ReduceOp::max ? BinaryOp::max : BinaryOp::add, a.data(), n, b.data(), n,
                               out.data(), n);
}

void finish_average(Communicator& comm, Tensor& t, ReduceOp op) {
  if (op == ReduceOp::average)
    kernels(t.device()).scale(t.data(), 1.0f / static_cast<float>(comm.size()), t.data(), static_cast<std::size_t>(t.numel()));
}

Tensor scratch(const Tensor& like, std::size_t count) {
  MemoryCategoryScope scope(MemoryCategory::communication);
  return Tensor::empty({static_cast<std::int64_t>(count)}, like.device());
}

Tensor slice(const Tensor& t, Chunk c) { return t.flat_view(c.begin, c.size()); }

void check_root(Communicator& comm, int root) {
  if (root < 0 || root >= comm.size())
    throw std::invalid_argument("root " + std::to_string(root) + " is out of range for " + std::to_string(comm.size()) + " ranks");
}

}  // namespace

Chunk chunk_of(std::size_t count, int ranks, int c) {
  std::size_t n = static_cast<std::size_t>(ranks), base = count / n, extra = count % n, i = static_cast<std::size_t>(c);
  std::size_t begin = i * base + std::min(i, extra);  // the first `extra` chunks get one more element
  return {begin, begin + base + (i < extra ? 1 : 0)};
}

void naive_broadcast(Communicator& comm, Tensor& t, int root) {
  check_root(comm, root);
  if (comm.rank() == root) {
    for (int peer = 0; peer < comm.size(); ++peer)
      if (peer != root) comm.send(t, peer);
  } else {
    comm.recv(t, root);
  }
}

void naive_reduce(Communicator& comm, Tensor& t, int root, ReduceOp op) {
  check_root(comm, root);
  if (comm.rank() != root) {
    comm.send(t, root);
    return;
  }
  Tensor incoming = scratch(t, static_cast<std::size_t>(t.numel()));
  for (int peer = 0; peer < comm.size(); ++peer) {
    if (peer == root) continue;
    comm.recv(incoming, peer);
    reduce_into(t, t, incoming, op);
  }
  finish_average(comm, t, op);
}

// Ranks are renumbered relative to the root (v = 0 is the root), so the tree works for any root.
void tree_broadcast(Communicator& comm, Tensor& t, int root) {
  check_root(comm, root);
  const int n = comm.size(), v = (comm.rank() - root + n) % n;
  for (int mask = 1; mask < n; mask <<= 1) {
    if (v < mask) {  // has the data: pass it on to v + mask
      if (v + mask < n) comm.send(t, (v + mask + root) % n);
    } else if (v < 2 * mask) {  // receives it this round from v - mask
      comm.recv(t, (v - mask + root) % n);
    }
  }
}

// The broadcast tree run backwards: in round k, ranks whose bit k is set send their partial sum
// 2^k ranks down and drop out; the others add what they receive.
void tree_reduce(Communicator& comm, Tensor& t, int root, ReduceOp op) {
  check_root(comm, root);
  const int n = comm.size(), v = (comm.rank() - root + n) % n;
  Tensor incoming;
  for (int mask = 1; mask < n; mask <<= 1) {
    if (v & mask) {
      comm.send(t, (v - mask + root) % n);
      return;  // non-roots end holding a partial result; only the root's is the reduction
    }
    if (v + mask < n) {
      if (!incoming.defined()) incoming = scratch(t, static_cast<std::size_t>(t.numel()));
      comm.recv(incoming, (v + mask + root) % n);
      reduce_into(t, t, incoming, op);
    }
  }
  finish_average(comm, t, op);
}

namespace {
// The ring's schedule (reduce_scatter_step): after n-1 steps rank r holds chunk r fully reduced.
//
// With `segment` > 0 the chunks travel as segments of that many elements, all posted at once: each
// segment is added as soon as it has arrived, while the later ones are still on their way, and it
// is added while it is still in cache. Production rings (NCCL's) do the same.
void ring_reduce_scatter_in_place(Communicator& comm, Tensor& t, ReduceOp op, std::size_t segment) {
  const int n = comm.size(), r = comm.rank();
  const auto count = static_cast<std::size_t>(t.numel());
  const int next = (r + 1) % n, prev = (r - 1 + n) % n;
  Tensor incoming = scratch(t, chunk_of(count, n, 0).size());  // chunk 0 is the largest
  for_each_reduce_scatter_step(r, n, count, [&](int, Chunk send, Chunk recv) {
    Tensor in = incoming.flat_view(0, recv.size());
    Tensor target = slice(t, recv);
    if (segment == 0) {
      comm.send_recv(slice(t, send), next, in, prev);
      reduce_into(target, target, in, op);
      return;
    }
    // Segment k is message k (its tag); the peer computes the same segments of the same chunk.
    std::vector<WorkHandle> sends, recvs;
    for (std::size_t at = 0, k = 0; at < recv.size(); at += segment, ++k) {
      Tensor piece = in.flat_view(at, std::min(segment, recv.size() - at));
      recvs.push_back(comm.recv_async(piece, prev, static_cast<int>(k)));
    }
    for (std::size_t at = 0, k = 0; at < send.size(); at += segment, ++k)
      sends.push_back(comm.send_async(slice(t, {send.begin + at, send.begin + std::min(send.size(), at + segment)}),
                                      next, static_cast<int>(k)));
    for (std::size_t k = 0; k < recvs.size(); ++k) {
      recvs[k]->wait();
      const std::size_t at = k * segment, size = std::min(segment, recv.size() - at);
      Tensor part = target.flat_view(at, size);
      reduce_into(part, part, in.flat_view(at, size), op);
    }
    for (auto& w : sends) w->wait();
  });
}

// Then each rank passes the newest complete chunk on (all_gather_step).
void ring_all_gather_in_place(Communicator& comm, Tensor& t, const std::function<Chunk(int)>& chunk) {
  const int n = comm.size(), r = comm.rank();
  const int next = (r + 1) % n, prev = (r - 1 + n) % n;
  for (int s = 0; s < n - 1; ++s) {
    const RingStep at = all_gather_step(r, s, n);
    Tensor in = slice(t, chunk(at.receive));
    comm.send_recv(slice(t, chunk(at.send)), next, in, prev);
  }
}
}  // namespace

void ring_all_reduce(Communicator& comm, Tensor& t, ReduceOp op, std::size_t segment) {
  if (comm.size() == 1) return;
  ring_reduce_scatter_in_place(comm, t, op, segment);
  const auto count = static_cast<std::size_t>(t.numel());
  ring_all_gather_in_place(comm, t, [&](int c) { return chunk_of(count, comm.size(), c); });
  finish_average(comm, t, op);
}

void ring_all_gather(Communicator& comm, const Tensor& input, Tensor& output) {
  const auto each = static_cast<std::size_t>(input.numel());
  if (static_cast<std::size_t>(output.numel()) != each * static_cast<std::size_t>(comm.size()))
    throw std::invalid_argument("ring_all_gather: output must hold ranks x input elements");
  Tensor own = output.flat_view(each * static_cast<std::size_t>(comm.rank()), each);
  own.copy_from(input);
  ring_all_gather_in_place(comm, output, [each](int c) {
    return Chunk{each * static_cast<std::size_t>(c), each * static_cast<std::size_t>(c + 1)};
  });
}

// The same ring without touching the input: the partial sum travelling round the ring is the only
// state, so two chunk-sized buffers suffice. In step s, rank r sends its partial of the step's block
// (its own block, unreduced, in step 0) and combines the arriving partial with its own copy of the
// block it receives; in the last step that block is r, and the result lands in `output`.
void ring_reduce_scatter(Communicator& comm, const Tensor& input, Tensor& output, ReduceOp op) {
  const auto each = static_cast<std::size_t>(output.numel());
  const int n = comm.size(), r = comm.rank();
  if (static_cast<std::size_t>(input.numel()) != each * static_cast<std::size_t>(n))
    throw std::invalid_argument("ring_reduce_scatter: input must hold ranks x output elements");
  auto block = [&](int c) { return input.flat_view(each * static_cast<std::size_t>(c), each); };
  if (n == 1) {
    output.copy_from(input);
    return;
  }
  Tensor incoming = scratch(input, each), partial = scratch(input, each);
  for (int s = 0; s < n - 1; ++s) {
    const RingStep at = reduce_scatter_step(r, s, n);
    comm.send_recv(s == 0 ? block(at.send) : partial, (r + 1) % n, incoming, (r - 1 + n) % n);
    Tensor& target = s == n - 2 ? output : partial;
    reduce_into(target, block(at.receive), incoming, op);
  }
  finish_average(comm, output, op);
}

}  // namespace course::comm::algorithms
