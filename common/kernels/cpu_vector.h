// Row reductions for the CPU kernels, written so that the compiler vectorises them without being allowed
// to reorder float additions (math::lane_sum, and a max over lanes), and the AVX2 build of their loops.
#pragma once
#include <cstddef>

#include "common/kernels/math.h"

// The loops are also compiled for AVX2 (x86-64-v3), 8 floats at a time; the CPU picks the version when
// the program loads. Floating-point contraction is off for the files that use it (CMakeLists.txt), so
// both versions round every operation alike.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_ADDRESS__)
#define COURSE_CPU_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define COURSE_CPU_CLONES
#endif

namespace course::cpu {

using math::kLanes;
using math::lane_sum;  // sum of term(i) for i in [0, n): kLanes float accumulators, added in double

// max of x[0..n), n >= 1 (std::max's rule: a NaN in x may be skipped, as in std::max_element).
inline float lane_max(const float* x, std::size_t n) {
  float acc[kLanes];
  for (std::size_t l = 0; l < kLanes; ++l) acc[l] = x[0];
  std::size_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (std::size_t l = 0; l < kLanes; ++l) acc[l] = acc[l] < x[i + l] ? x[i + l] : acc[l];
  for (std::size_t l = 0; i + l < n; ++l) acc[l] = acc[l] < x[i + l] ? x[i + l] : acc[l];
  float top = acc[0];
  for (std::size_t l = 1; l < kLanes; ++l) top = top < acc[l] ? acc[l] : top;
  return top;
}

}  // namespace course::cpu
