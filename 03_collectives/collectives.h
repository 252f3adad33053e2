// Chapter 03's collectives, written by hand over send and recv: the exercises of the chapter (03.1-03.3),
// which its demonstration runs. The library keeps its own copy (common/comm/algorithms.h: the MPI
// backend's ordered sums and the references use them), which the graded tests hold these against
// (tests/collectives_exercise_test.cpp). Each works for any number of ranks and any element count.
#pragma once
#include "common/comm/communicator.h"

namespace course::chapter03 {

// Binomial tree: in round k every rank that has the data sends it 2^k ranks further (counted from the
// root), so all n ranks have it after ceil(log2 n) rounds.
void tree_broadcast(comm::Communicator& comm, Tensor& tensor, int root);
// Ring reduce-scatter: `input` holds n chunks of output.numel() elements; rank r ends with the sum over
// every rank of chunk r in `output`, after n - 1 steps of one chunk sent and one received.
void ring_reduce_scatter(comm::Communicator& comm, const Tensor& input, Tensor& output);
// Ring all-gather: every rank's `input` lands at its rank's place in every rank's `output` (n x input),
// after n - 1 steps round the ring.
void ring_all_gather(comm::Communicator& comm, const Tensor& input, Tensor& output);
// The ring all-reduce is the two above in turn (Patarasuk & Yuan, 2009): each rank sends 2(n-1)/n of the
// data, whatever n. Any element count: padded with zeros to a multiple of the ranks.
void ring_all_reduce(comm::Communicator& comm, Tensor& tensor);

}  // namespace course::chapter03
