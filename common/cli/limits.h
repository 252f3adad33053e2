// Refusing a configuration that cannot fit before allocating it: a size flag of 99999999999 gets one
// line naming the flags and the estimate, not a std::bad_alloc half a minute later.
#pragma once
#include <cstdint>
#include <string>

namespace course::cli {

// Bytes a training run of an MLP needs, roughly and from above: the dataset (host copy and the
// generator's), parameters with their gradients and optimizer state, and a batch's activations
// kept for backward. Computed in double, so no size overflows.
double mlp_training_bytes(std::int64_t samples, std::int64_t features, std::int64_t hidden, std::int64_t layers,
                          std::int64_t batch);

// This machine's physical memory in bytes.
double physical_memory_bytes();

// Throws UsageError "<flags> need about X, more than the Y this rank can use" when `bytes` exceeds
// this rank's share of the machine's memory (`ranks_here` ranks share it).
void check_memory(double bytes, const std::string& flags, int ranks_here = 1);

}  // namespace course::cli
