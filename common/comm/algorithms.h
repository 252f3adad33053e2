// Collectives written by hand over point-to-point send/recv: the heart of chapter 03.
// Each works for any number of ranks and any element count (0, 1, not divisible by the ranks).
// The library versions (Communicator::all_reduce, ...) are what they are checked against.
#pragma once
#include "common/comm/communicator.h"

namespace course::comm::algorithms {

// Naive: the root sends to every peer in turn, n-1 transfer times ("send a file to 7 friends").
void naive_broadcast(Communicator& comm, Tensor& tensor, int root);
// Naive: the root receives from every peer in turn and adds each in.
void naive_reduce(Communicator& comm, Tensor& tensor, int root, ReduceOp op = ReduceOp::sum);

// Binomial tree: in round k every rank that has the data sends it 2^k ranks further, so all n
// ranks have it after ceil(log2 n) rounds: 3 transfer times for 8 ranks instead of 7.
void tree_broadcast(Communicator& comm, Tensor& tensor, int root);
void tree_reduce(Communicator& comm, Tensor& tensor, int root, ReduceOp op = ReduceOp::sum);

// Ring (Patarasuk & Yuan, "Bandwidth optimal all-reduce algorithms for clusters of workstations",
// 2009): reduce-scatter then all-gather around the ring, each rank sending 2(n-1)/n of the data.
// `segment` > 0 pipelines the reduce-scatter: chunks travel in segments of that many elements, and
// each is added while the next ones arrive (kRingSegment is the benchmark's choice).
constexpr std::size_t kRingSegment = 64 * 1024;  // 256 KiB of floats: fits in a core's L2 cache
void ring_all_reduce(Communicator& comm, Tensor& tensor, ReduceOp op = ReduceOp::sum, std::size_t segment = 0);
void ring_all_gather(Communicator& comm, const Tensor& input, Tensor& output);                    // output: n x input
void ring_reduce_scatter(Communicator& comm, const Tensor& input, Tensor& output, ReduceOp op = ReduceOp::sum);  // input: n x output

// Chunk c of `count` elements split across n ranks as evenly as possible: its [begin, end).
struct Chunk {
  std::size_t begin, end;
  std::size_t size() const { return end - begin; }
};
Chunk chunk_of(std::size_t count, int ranks, int c);

// The ring's schedule, the one every ring of the library follows: the collectives above, the MPI
// backend's ordered sums (Communicator::add_in_ring_order, and every 16-bit sum) and verify::LocalGroup's
// in-process ones, so that all three add in one order and a reference in one process repeats a run's
// sums bit for bit. The values are cut into a chunk a rank (chunk_of). In step s = 0 .. ranks - 2 of the
// reduce-scatter, rank r sends chunk r - s - 1 (its own values at step 0, then the partial sum it made in
// the step before) to rank r + 1, and adds the partial of chunk r - s - 2 arriving from rank r - 1 to its
// own values of it: chunk c's sum begins at rank c + 1 and goes round, a rank's term a step, to end
// complete at rank c. In step s of the all-gather, rank r passes the complete chunk r - s on and
// receives chunk r - s - 1.
struct RingStep {
  int send, receive;  // the chunks' indices
};
inline int ring_index(int i, int ranks) { return (i % ranks + ranks) % ranks; }
inline RingStep reduce_scatter_step(int rank, int step, int ranks) {
  return {ring_index(rank - step - 1, ranks), ring_index(rank - step - 2, ranks)};
}
inline RingStep all_gather_step(int rank, int step, int ranks) {
  return {ring_index(rank - step, ranks), ring_index(rank - step - 1, ranks)};
}
// The reduce-scatter's steps for this rank, whatever carries them: body(step, send chunk, receive chunk).
template <class Body>
void for_each_reduce_scatter_step(int rank, int ranks, std::size_t count, Body body) {
  for (int s = 0; s + 1 < ranks; ++s) {
    const RingStep at = reduce_scatter_step(rank, s, ranks);
    body(s, chunk_of(count, ranks, at.send), chunk_of(count, ranks, at.receive));
  }
}

}  // namespace course::comm::algorithms
