// Counter-based random numbers: the value at index i is a pure function of (seed, i).
// Any device, any order of generation, any split of the work gives the same numbers; this is the idea
// of Salmon et al., "Parallel random numbers: as easy as 1, 2, 3" (SC 2011), here with SplitMix64, whose
// integer arithmetic runs alike on the CPU and in a CUDA kernel (dropout draws its masks on the device).
#pragma once
#include <cstdint>

#include "common/kernels/rounded.h"  // COURSE_HOST_DEVICE

namespace course {

COURSE_HOST_DEVICE inline std::uint64_t random_bits(std::uint64_t seed, std::uint64_t index) {
  // SplitMix64 finaliser (Steele, Lea, Flood: "Fast splittable pseudorandom number generators", 2014).
  std::uint64_t z = seed * 0x9E3779B97F4A7C15ULL + index + 0x632BE59BD9B4E019ULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  z ^= z >> 31;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;  // a second round decorrelates nearby seeds
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// In [0, 1): the top 53 bits, exactly a double (the product by 2^-53 is exact).
COURSE_HOST_DEVICE inline double random_uniform(std::uint64_t seed, std::uint64_t index) {
  return static_cast<double>(random_bits(seed, index) >> 11) * 0x1.0p-53;
}

double random_normal(std::uint64_t seed, std::uint64_t index);  // standard normal

}  // namespace course
