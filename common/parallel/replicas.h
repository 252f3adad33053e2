// Checks across replicas, for every parallel strategy (DDP, ZeRO, TP): are the ranks' parameters
// bit-identical, and run this on rank 0 only.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "common/comm/communicator.h"

namespace course::parallel {

// FNV-1a over the tensors' bytes, in order: any differing bit changes it.
std::uint64_t parameter_checksum(const std::vector<Tensor>& parameters);

// Gathers every rank's checksum over `group`: true when all are bit-identical. Collective.
bool parameters_identical(comm::Communicator& group, const std::vector<Tensor>& parameters);

// Runs `work` on rank 0 of `group` only (saving, statistics); with `wait`, the others wait for it.
void on_rank0(comm::Communicator& group, const std::function<void()>& work, bool wait = false);

}  // namespace course::parallel
