// Reductions on the GPU in fixed orders, never atomics: a tensor's sum, column sums in two stages, the
// sum of squares in the tiling squares_tiled models on the CPU.
#include <cmath>

#include "common/kernels/cuda_kernels.h"

namespace course {
using namespace cuda_launch;
namespace {

// One block; thread t sums elements t, t+1024, ... in double, then a fixed tree combines the partials.
__global__ void sum_kernel(const float* in, std::size_t n, float* out) {
  __shared__ double partial[kReduceThreads];
  double total = 0.0;
  for (std::size_t i = threadIdx.x; i < n; i += blockDim.x) total += in[i];
  partial[threadIdx.x] = total;
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) partial[threadIdx.x] += partial[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0) *out = static_cast<float>(partial[0]);
}

// Column sums in math::column_chunks' two stages: a thread per column and chunk of rows (coalesced reads
// along a row), then a thread per column adding its chunks in order. The CPU's bits.
__global__ void sum_rows_chunks_kernel(const float* in, std::size_t rows, std::size_t cols, double* partial) {
  for (std::size_t c = blockIdx.x * blockDim.x + threadIdx.x; c < cols; c += gridDim.x * blockDim.x)
    for (std::size_t chunk = blockIdx.y; chunk < math::column_chunks(rows); chunk += gridDim.y)
      partial[chunk * cols + c] = math::column_chunk_sum(in, rows, cols, chunk, c);
}

__global__ void column_totals_kernel(const double* partial, std::size_t chunks, std::size_t cols, float* out) {
  for (std::size_t c = blockIdx.x * blockDim.x + threadIdx.x; c < cols; c += gridDim.x * blockDim.x)
    out[c] = math::column_total(partial, chunks, cols, c);
}

// Clipping's sum of squares, tiled as squares_tiled (kernels.h) models it on the CPU: kSquaresBlocks blocks
// each sum a fixed share and fold it by a fixed tree; then one thread adds the blocks' sums to the total in
// block order. The CPU's bits, every run.
__global__ void squares_kernel(const float* in, std::size_t n, double* partial) {
  __shared__ double share[kSquaresThreads];
  double total = 0.0;
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    const auto x = static_cast<double>(in[i]);
    total = rn::add(total, rn::mul(x, x));
  }
  share[threadIdx.x] = total;
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) share[threadIdx.x] = rn::add(share[threadIdx.x], share[threadIdx.x + stride]);
    __syncthreads();
  }
  if (threadIdx.x == 0) partial[blockIdx.x] = share[0];
}

__global__ void squares_total_kernel(const double* partial, int blocks, double* total) {
  double sum = *total;
  for (int b = 0; b < blocks; ++b) sum = rn::add(sum, partial[b]);
  *total = sum;
}

__global__ void clip_coefficient_kernel(const double* total, double max_norm, float* norm, float* factor) {
  const auto value = static_cast<float>(rn::sqrt(*total));
  *norm = value;
  *factor = math::clip_coefficient(value, max_norm);
}

}  // namespace

void CudaKernels::sum(const float* in, std::size_t n, float* out) {
  sum_kernel<<<1, kReduceThreads>>>(in, n, out);
  check_launch();
}

void CudaKernels::sum_rows(const float* in, std::size_t rows, std::size_t cols, float* out) {
  if (!cols) return;
  const std::size_t chunks = math::column_chunks(rows);
  DeviceBuffer partial(2 * chunks * cols);  // [chunks, cols] doubles
  auto* sums = reinterpret_cast<double*>(partial.get());
  if (chunks) {
    sum_rows_chunks_kernel<<<column_grid(cols, chunks), kThreads>>>(in, rows, cols, sums);
    check_launch();
  }
  column_totals(sums, chunks, cols, out);
}

void CudaKernels::add_squares(const float* in, std::size_t n, double* total) {
  if (!n) return;
  DeviceBuffer partial(2 * kSquaresBlocks);  // kSquaresBlocks doubles
  auto* sums = reinterpret_cast<double*>(partial.get());
  squares_kernel<<<kSquaresBlocks, kSquaresThreads>>>(in, n, sums);
  check_launch();
  squares_total_kernel<<<1, 1>>>(sums, kSquaresBlocks, total);
  check_launch();
}

void CudaKernels::clip_coefficient(const double* total, double max_norm, float* norm, float* factor) {
  clip_coefficient_kernel<<<1, 1>>>(total, max_norm, norm, factor);
  check_launch();
}

void CudaKernels::column_totals(const double* partial, std::size_t chunks, std::size_t cols, float* out) {
  column_totals_kernel<<<blocks_for(cols), kThreads>>>(partial, chunks, cols, out);
  check_launch();
}

}  // namespace course
