// Refusing a configuration that cannot fit before allocating it: a size flag of 99999999999 gets one
// line naming the flags and the estimate, not a std::bad_alloc half a minute later. And the budget a
// chapter may set on purpose (--mem-limit-mb), to show what a method saves.
#pragma once
#include "common/cli/forward.h"
#include <cstdint>
#include <string>

#include "common/core/device.h"

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

// --mem-limit-mb (07, 08): a budget per rank on the counted device memory; an allocation past it throws
// OutOfMemory (common/core/memory.h), naming what it needed.
void add_memory_limit_option(CLI::App& app, double& mb);
// Sets the budget on `device` (none for 0); returns ", memory limit X per rank" for the log, or "".
std::string apply_memory_limit(double mb, Device device);

}  // namespace course::cli
