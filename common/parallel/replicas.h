// Checks across replicas, for every parallel strategy (DDP, ZeRO, TP): are the ranks' parameters
// bit-identical, and run this on rank 0 only.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "common/comm/communicator.h"
#include "common/optim/optimizer.h"

namespace course::parallel {

// FNV-1a over the tensors' bytes in order, in eight lanes (checkpoint/checksum.h): one differing bit changes it.
std::uint64_t parameter_checksum(const std::vector<Tensor>& parameters);
// The same over values already on the host (a model's parameters_to_host() gives the tensors' checksum).
std::uint64_t parameter_checksum(const std::vector<float>& values);

// Every rank's checksum over `group`, in rank order. Collective.
std::vector<std::uint64_t> gather_checksums(comm::Communicator& group, std::uint64_t mine);

// Gathers every rank's checksum over `group`: true when all are bit-identical. Collective.
bool parameters_identical(comm::Communicator& group, const std::vector<Tensor>& parameters);

// --fault stray-replica: this replica's first element of `parameter` one unit in the last place up, so that
// it alone no longer holds its replicas' bits.
void stray_by_one_rounding(const Tensor& parameter);
// --fault stray-moment (04, 08): the first element of the first state `optimizer` keeps
// for `parameter` (Adam's first moment, SGD's momentum) one unit in the last place up; nothing when it
// keeps none for it (SGD without momentum, or before its first step).
void stray_state_by_one_rounding(const optim::Optimizer& optimizer, const Tensor& parameter);

// Runs `work` on rank 0 of `group` only (saving, a trace, statistics), and every rank learns whether it
// failed: then all throw rank 0's error alike (a UsageError as one, anything else as a SharedError), so
// the job ends with one line and together, never with rank 0 aborting while the others finish. The
// others wait for it. Collective.
void on_rank0(comm::Communicator& group, const std::function<void()>& work);

}  // namespace course::parallel
