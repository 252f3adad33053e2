// Counter-based random numbers: the value at index i is a pure function of (seed, i).
// Any device, any order of generation, any split of the work gives the same numbers; this is the idea
// of Salmon et al., "Parallel random numbers: as easy as 1, 2, 3" (SC 2011), here with SplitMix64.
#pragma once
#include <cstdint>

namespace course {

std::uint64_t random_bits(std::uint64_t seed, std::uint64_t index);
double random_uniform(std::uint64_t seed, std::uint64_t index);  // in [0, 1)
double random_normal(std::uint64_t seed, std::uint64_t index);   // standard normal

}  // namespace course
