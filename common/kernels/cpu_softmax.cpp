// Softmax by rows on the CPU, causal or not, and its gradient, summed in double.
#include <algorithm>
#include <cmath>

#include "common/kernels/cpu_kernels.h"

namespace course {
using namespace cpu_loops;

void CpuKernels::softmax(const float* in, std::size_t rows, std::size_t cols, bool causal, float* out) {
  parallel_for(rows, cols, [&](std::size_t first, std::size_t end) {
  for (std::size_t r = first; r < end; ++r) {
    const std::size_t visible = causal ? r % cols + 1 : cols;  // query i sees keys 0..i
    const float* row = in + r * cols;
    float top = *std::max_element(row, row + visible);
    double total = 0.0;
    for (std::size_t c = 0; c < visible; ++c) total += std::exp(static_cast<double>(row[c] - top));
    for (std::size_t c = 0; c < cols; ++c)
      out[r * cols + c] =
          c < visible ? static_cast<float>(std::exp(static_cast<double>(row[c] - top)) / total) : 0.0f;
  }
  });
}

void CpuKernels::softmax_backward(const float* y, const float* g, std::size_t rows, std::size_t cols, float* dx) {
  parallel_for(rows, cols, [&](std::size_t first, std::size_t end) {
  for (std::size_t r = first; r < end; ++r) {
    double dot = 0.0;
    for (std::size_t c = 0; c < cols; ++c) dot += static_cast<double>(g[r * cols + c]) * y[r * cols + c];
    for (std::size_t c = 0; c < cols; ++c)
      dx[r * cols + c] = static_cast<float>(y[r * cols + c] * (g[r * cols + c] - dot));
  }
  });
}

}  // namespace course
