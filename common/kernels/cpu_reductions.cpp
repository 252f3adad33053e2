// Reductions on the CPU: a tensor's sum, column sums in the GPU's two stages, clipping's sum of squares
// in the CUDA kernel's tiling.
#include <algorithm>
#include <array>
#include <cmath>

#include "common/kernels/cpu_kernels.h"
#include "common/kernels/rounded.h"

namespace course {
using namespace cpu_loops;

void CpuKernels::sum(const float* in, std::size_t n, float* out) {
  double total = 0.0;  // double accumulation: the reference should not lose bits to summation order
  for (std::size_t i = 0; i < n; ++i) total += in[i];
  *out = static_cast<float>(total);
}

void CpuKernels::sum_rows(const float* in, std::size_t rows, std::size_t cols, float* out) {
  // In the two stages of math::column_chunks (the GPU's order), row by row within a chunk; the threads
  // take blocks of columns, so every column is summed in the same order at any thread count.
  parallel_for(cols, rows, [&](std::size_t first, std::size_t end) {
    column_sums(
        rows, first, end, 1,
        [&](std::size_t r, double* chunk) {
          for (std::size_t j = first; j < end; ++j) chunk[j - first] = rn::add(chunk[j - first], static_cast<double>(in[r * cols + j]));
        },
        [&](int, std::size_t j, float value) { out[j] = value; });
  });
}

void CpuKernels::add_squares(const float* in, std::size_t n, double* total) { *total = squares_tiled(in, n, *total); }

void CpuKernels::clip_coefficient(const double* total, double max_norm, float* norm, float* factor) {
  *norm = static_cast<float>(std::sqrt(*total));
  *factor = math::clip_coefficient(*norm, max_norm);
}

// The tiling's threads and blocks that hold no element are left out: their sums are +0, and adding +0
// to a sum of squares (never -0 after the first block's, which every total passes through) changes no
// bit, so a small tensor costs its elements, not the 32,768 threads of the tiling (clipping adds every
// tensor's squares at every step). The order of the remaining additions is the tiling's.
double squares_tiled(const float* in, std::size_t n, double total) {
  const auto threads = static_cast<std::size_t>(kSquaresThreads), stride_all = threads * kSquaresBlocks;
  std::array<double, kSquaresThreads> share{};
  for (std::size_t b = 0; b < static_cast<std::size_t>(kSquaresBlocks); ++b) {
    // The threads of this block that hold an element: all of them once n fills the tiling.
    const std::size_t live = n >= stride_all ? threads : std::min(threads, n > b * threads ? n - b * threads : 0);
    if (live == 0 && b > 0) break;  // and every later block's too (block 0 of n = 0 adds its +0, as the kernel does)
    for (std::size_t t = 0; t < live; ++t) {
      double sum = 0.0;
      for (std::size_t i = b * threads + t; i < n; i += stride_all) {
        const auto x = static_cast<double>(in[i]);
        sum = rn::add(sum, rn::mul(x, x));
      }
      share[t] = sum;
    }
    // The halving folds, over the shares that are not +0: s[t] += s[t + stride] wherever t + stride is live.
    std::size_t folded = live;
    for (std::size_t stride = threads / 2; stride > 0; stride /= 2) {
      for (std::size_t t = 0; t < stride && t + stride < folded; ++t) share[t] = rn::add(share[t], share[t + stride]);
      folded = std::min(folded, stride);
    }
    total = rn::add(total, share[0]);
  }
  return total;
}

}  // namespace course
