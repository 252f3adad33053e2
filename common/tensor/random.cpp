// SplitMix64 hashing of (seed, index), and Box-Muller for normal values.
#include "common/tensor/random.h"

#include <cmath>
#include <numbers>

namespace course {

std::uint64_t random_bits(std::uint64_t seed, std::uint64_t index) {
  // SplitMix64 finaliser (Steele, Lea, Flood: "Fast splittable pseudorandom number generators", 2014).
  std::uint64_t z = seed * 0x9E3779B97F4A7C15ULL + index + 0x632BE59BD9B4E019ULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  z ^= z >> 31;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;  // a second round decorrelates nearby seeds
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

double random_uniform(std::uint64_t seed, std::uint64_t index) {
  return static_cast<double>(random_bits(seed, index) >> 11) * 0x1.0p-53;
}

double random_normal(std::uint64_t seed, std::uint64_t index) {
  // Box-Muller on two independent uniforms drawn from two streams of the same index.
  double u1 = 1.0 - random_uniform(seed, 2 * index);  // in (0, 1], so log is finite
  double u2 = random_uniform(seed, 2 * index + 1);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

}  // namespace course
