// Row reductions for the CPU kernels, written so that the compiler vectorises them without being allowed
// to reorder float additions (math::lane_sum, and a max over lanes), and the AVX2 build of their loops.
#pragma once
#include <cstddef>

#include "common/kernels/rows.h"

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
using math::lane_max;  // their maximum, by the same lanes

}  // namespace course::cpu
