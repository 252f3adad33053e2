// Softmax by rows on the GPU, a thread per row, summed in double, and its gradient.
#include <cmath>

#include "common/kernels/cuda_kernels.h"

namespace course {
using namespace cuda_launch;
namespace {

// One thread per row, the CPU reference's arithmetic (exp and sums in double).
__global__ void softmax_kernel(const float* in, std::size_t rows, std::size_t cols, bool causal, float* out) {
  const std::size_t r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  const std::size_t visible = causal ? r % cols + 1 : cols;
  const float* row = in + r * cols;
  float top = row[0];
  for (std::size_t c = 1; c < visible; ++c) top = fmaxf(top, row[c]);
  double total = 0.0;
  for (std::size_t c = 0; c < visible; ++c) total += exp(static_cast<double>(row[c] - top));
  for (std::size_t c = 0; c < cols; ++c)
    out[r * cols + c] = c < visible ? static_cast<float>(exp(static_cast<double>(row[c] - top)) / total) : 0.0f;
}

__global__ void softmax_backward_kernel(const float* y, const float* g, std::size_t rows, std::size_t cols, float* dx) {
  const std::size_t r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  double dot = 0.0;
  for (std::size_t c = 0; c < cols; ++c) dot += static_cast<double>(g[r * cols + c]) * y[r * cols + c];
  for (std::size_t c = 0; c < cols; ++c) dx[r * cols + c] = static_cast<float>(y[r * cols + c] * (g[r * cols + c] - dot));
}

}  // namespace

void CudaKernels::softmax(const float* in, std::size_t rows, std::size_t cols, bool causal, float* out) {
  if (!rows || !cols) return;
  softmax_kernel<<<blocks_for(rows), kThreads>>>(in, rows, cols, causal, out);
  check_launch();
}

void CudaKernels::softmax_backward(const float* y, const float* g, std::size_t rows, std::size_t cols, float* dx) {
  if (!rows || !cols) return;
  softmax_backward_kernel<<<blocks_for(rows), kThreads>>>(y, g, rows, cols, dx);
  check_launch();
}

}  // namespace course
