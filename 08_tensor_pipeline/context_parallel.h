// Lesson 3, context parallelism: every sequence split across the ranks of a CP group. Each rank holds a
// slice of every sequence's tokens; attention, the one op that mixes tokens, sees the whole sequence by a
// ring of key-value blocks (Liu et al., 2023) or by two all-to-alls to head shards (Ulysses, Jacobs et
// al., 2023): common/parallel/context_parallel.h. What the chapter adds: sequences padded to a length
// the ranks can split, and the group's attention that the model's blocks call. The replicas' mean then
// counts each rank's tokens as one more replica (main.cpp, dp_cp_group).
#pragma once
#include <cstdint>
#include <memory>

#include "08_tensor_pipeline/options.h"
#include "common/data/addition.h"
#include "common/parallel/context_parallel.h"
#include "common/parallel/topology.h"

namespace course::chapter08 {

// A sequence of `length` tokens padded to what --cp ranks split by --cp-method (the ring's balanced
// layout cuts it into 2 x CP chunks, Ulysses into CP).
std::int64_t context_parallel_sequence(const Options& o, std::int64_t length);
// `batch`'s problems of `length` tokens padded at their ends to `sequence`, the padding's targets ignored.
data::AdditionTask::Batch padded(const data::AdditionTask::Batch& batch, std::int64_t length, std::int64_t sequence);
// The CP group's attention (ring or Ulysses), which the GPT's blocks call; none without --cp.
std::unique_ptr<parallel::ContextParallel> make_context_parallel(const Options& o, bool gpt, parallel::Topology& topology);

}  // namespace course::chapter08
