// Layer norm on the GPU: a row in kLanes lanes (rows.h's formulas), the parameters' gradients in the
// two-stage column sums.

#include "common/kernels/cuda_kernels.h"
#include "common/kernels/rows.h"

namespace course {
using namespace cuda_launch;
namespace {

// Layer norm's rows in lanes (rows.h): the CPU's arithmetic, addition by addition.
__global__ void layer_norm_kernel(const float* x, const float* w, const float* b, std::size_t rows, std::size_t cols,
                                  float eps, float* out, float* mean, float* rstd) {
  for_each_row_in_lanes(rows, [&](const GroupLanes& lanes, std::size_t r) {
    math::layer_norm_row(lanes, x + r * cols, w, b, cols, eps, out + r * cols, mean + r, rstd + r);
  });
}

__global__ void layer_norm_backward_x_kernel(const float* x, const float* w, const float* mean, const float* rstd,
                                             const float* g, std::size_t rows, std::size_t cols, float* dx) {
  for_each_row_in_lanes(rows, [&](const GroupLanes& lanes, std::size_t r) {
    math::layer_norm_backward_row(lanes, x + r * cols, w, mean[r], rstd[r], g + r * cols, cols, dx + r * cols);
  });
}

// Stage 1 of the weight's and bias's gradients (math::layer_norm_params_chunk): a thread per column and
// chunk; `partial` holds the weight's chunk sums, then the bias's ([2, chunks, cols]).
__global__ void layer_norm_params_chunks_kernel(const float* x, const float* mean, const float* rstd, const float* g,
                                                std::size_t rows, std::size_t cols, double* partial) {
  const std::size_t chunks = math::column_chunks(rows);
  for (std::size_t c = blockIdx.x * blockDim.x + threadIdx.x; c < cols; c += gridDim.x * blockDim.x)
    for (std::size_t chunk = blockIdx.y; chunk < chunks; chunk += gridDim.y)
      math::layer_norm_params_chunk(x, mean, rstd, g, rows, cols, chunk, c, &partial[chunk * cols + c],
                                    &partial[(chunks + chunk) * cols + c]);
}

}  // namespace

void CudaKernels::layer_norm(const float* x, const float* w, const float* b, std::size_t rows, std::size_t cols, float eps,
                float* out, float* mean, float* rstd) {
  if (!rows) return;
  layer_norm_kernel<<<blocks_for(rows * math::kLanes), kThreads>>>(x, w, b, rows, cols, eps, out, mean, rstd);
  check_launch();
}

void CudaKernels::layer_norm_backward(const float* x, const float* w, const float* mean, const float* rstd, const float* g,
                         std::size_t rows, std::size_t cols, float* dx, float* dw, float* db) {
  if (rows) {
    layer_norm_backward_x_kernel<<<blocks_for(rows * math::kLanes), kThreads>>>(x, w, mean, rstd, g, rows, cols, dx);
    check_launch();
  }
  if (cols) {
    const std::size_t chunks = math::column_chunks(rows);
    DeviceBuffer partial(4 * chunks * cols);  // [2, chunks, cols] doubles
    auto* sums = reinterpret_cast<double*>(partial.get());
    if (chunks) {
      layer_norm_params_chunks_kernel<<<column_grid(cols, chunks), kThreads>>>(x, mean, rstd, g, rows, cols, sums);
      check_launch();
    }
    column_totals(sums, chunks, cols, dw);
    column_totals(sums + chunks * cols, chunks, cols, db);
  }
}

}  // namespace course
