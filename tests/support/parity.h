// What the kernel parity tests share: the tolerance where the two devices must add in different orders,
// the bit-for-bit and the close comparisons, and the skip where no GPU is usable.
#pragma once
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "common/core/device.h"

namespace course::testing {

// Where the two devices add in different orders: cuBLAS and the CPU's BLAS in their GEMMs, a GPU's tree
// and the CPU's loop in a sum over a whole tensor (a mean's), the attention kernels' own sums (one thread
// per row on the GPU, lanes on the CPU). 1e-5 relative is a few float32 ulps accumulated over
// this table's small shapes.
constexpr double kParityTolerance = 1e-5;

inline void expect_same_bits(const std::vector<float>& cuda, const std::vector<float>& cpu, const std::string& what) {
  ASSERT_EQ(cuda.size(), cpu.size()) << what;
  for (std::size_t i = 0; i < cpu.size(); ++i)
    EXPECT_EQ(std::bit_cast<std::uint32_t>(cuda[i]), std::bit_cast<std::uint32_t>(cpu[i]))
        << what << " element " << i << ": " << cuda[i] << " on the GPU, " << cpu[i] << " on the CPU";
}

#define SKIP_WITHOUT_GPU()                                      \
  do {                                                          \
    std::string reason;                                         \
    if (!cuda_usable(&reason)) GTEST_SKIP() << "no usable GPU: " << reason; \
  } while (0)

inline void expect_close(const std::vector<float>& cuda, const std::vector<float>& cpu, const std::string& what) {
  ASSERT_EQ(cuda.size(), cpu.size()) << what;
  for (std::size_t i = 0; i < cpu.size(); ++i)
    EXPECT_NEAR(cuda[i], cpu[i], kParityTolerance * (1.0 + std::fabs(cpu[i]))) << what << " element " << i;
}

}  // namespace course::testing
