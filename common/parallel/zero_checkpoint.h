// A ZeRO run's sharded checkpoint (checkpoint/sharded.h): each rank saves its part of the parameters
// and of Adam's moments (ZeroOptimizer::state_shard), with the settings that make a step what it is;
// resuming at the same world size and stage restores them all, so the run continues bit for bit.
#pragma once
#include <cstdint>

#include <nlohmann/json.hpp>

#include "common/checkpoint/sharded.h"
#include "common/parallel/zero.h"

namespace course::parallel {

// The layout of `model`'s parameters in `layout`'s flat units, as the index records it (what
// consolidation follows to put the shards back into whole tensors).
nlohmann::json describe_layout(const FlatLayout& layout, const nn::Module& model);

// Writes the checkpoint of `step` (collective). `settings` maps flag names ("stage", "lr", ...) to the
// run's values; a resume must match every one. Returns the bytes this rank wrote.
std::size_t save_zero_checkpoint(const checkpoint::ShardedFolder& folder, comm::Communicator& group,
                                 const ZeroOptimizer& zero, const nn::Module& model, std::int64_t step,
                                 const checkpoint::Metadata& settings, const checkpoint::WriteProgress& progress = {});

// Restores the newest complete checkpoint in `folder` into `zero` (collective) and returns its step.
// Throws UsageError naming the flag whose value differs from the checkpoint's ("--stage: 3 differs from
// the checkpoint's 2 ..."), or naming --resume when there is nothing complete to resume from or a
// shard is damaged.
std::int64_t resume_zero_checkpoint(const checkpoint::ShardedFolder& folder, comm::Communicator& group,
                                    ZeroOptimizer& zero, const checkpoint::Metadata& settings);

}  // namespace course::parallel
