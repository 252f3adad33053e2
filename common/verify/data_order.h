// The data order checked, not trusted: each step, the samples every rank actually trained on, gathered,
// must be the step's global batch exactly once, in the order a single-rank run reads it. The run, its
// reference and an uninterrupted twin may all cut their shares with the same sampler (a bug there is
// everyone's); this check holds the shares against the global batch alone, written out independently.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "common/comm/communicator.h"

namespace course::verify {

// Gathers every rank's `mine` (the samples it trained on this step, in the order it took them) over
// `group` and holds them against `global`, the step's batch as one rank reads it: position i must be
// rank (i mod R)'s sample number i / R (the ranks take turns, as DistributedSampler lays them out), so
// every sample is taken once and none twice. Returns "" when they are, else one line on rank 0 naming the
// first sample taken twice or by no one and the ranks involved ("" on the other ranks). Collective.
std::string check_data_order(comm::Communicator& group, const std::vector<std::int64_t>& mine,
                             const std::vector<std::int64_t>& global);

}  // namespace course::verify
