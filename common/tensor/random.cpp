// Box-Muller for normal values, from the counter-based uniforms of random.h.
#include "common/tensor/random.h"

#include <cmath>
#include <numbers>

namespace course {

double random_normal(std::uint64_t seed, std::uint64_t index) {
  // Box-Muller on two independent uniforms drawn from two streams of the same index.
  double u1 = 1.0 - random_uniform(seed, 2 * index);  // in (0, 1], so log is finite
  double u2 = random_uniform(seed, 2 * index + 1);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

}  // namespace course
