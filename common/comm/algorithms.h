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

// The ring's order of addition: chunk c's sum begins at rank c + 1 and goes round to end at rank c, its
// k-th term (k = 0 .. ranks - 1) coming from rank ring_source(c, k, ranks). The MPI backend adds 16-bit
// values in this order, as NCCL's ring all-reduce does, and comm::LocalGroup repeats it bit for bit.
inline int ring_source(int c, int k, int ranks) { return (c + 1 + k) % ranks; }

}  // namespace course::comm::algorithms
