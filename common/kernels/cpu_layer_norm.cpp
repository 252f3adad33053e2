// Layer norm on the CPU: rows.h's row formulas in lanes, the parameters' gradients in two-stage column
// sums (the GPU's order).

#include "common/kernels/cpu_kernels.h"
#include "common/kernels/cpu_vector.h"
#include "common/kernels/rounded.h"

namespace course {
using namespace cpu_loops;

namespace {

COURSE_CPU_CLONES void layer_norm_rows(const float* x, const float* w, const float* b, std::size_t first, std::size_t end,
                                       std::size_t cols, float eps, float* out, float* mean, float* rstd) {
  for (std::size_t r = first; r < end; ++r)
    math::layer_norm_row(math::AllLanes{}, x + r * cols, w, b, cols, eps, out + r * cols, mean + r, rstd + r);
}

COURSE_CPU_CLONES void layer_norm_backward_rows(const float* x, const float* w, const float* mean, const float* rstd,
                                                const float* g, std::size_t first, std::size_t end, std::size_t cols,
                                                float* dx) {
  for (std::size_t r = first; r < end; ++r)
    math::layer_norm_backward_row(math::AllLanes{}, x + r * cols, w, mean[r], rstd[r], g + r * cols, cols, dx + r * cols);
}

COURSE_CPU_CLONES void layer_norm_params_columns(const float* x, const float* mean, const float* rstd, const float* g,
                                                 std::size_t rows, std::size_t cols, std::size_t first, std::size_t end,
                                                 float* dw, float* db) {
  const std::size_t n = end - first;
  column_sums(
      rows, first, end, 2,
      [&](std::size_t r, double* chunk) {  // math::layer_norm_params_chunk's terms, row r of every column
        const float *xr = x + r * cols + first, *gr = g + r * cols + first;
        for (std::size_t c = 0; c < n; ++c) {
          chunk[c] = rn::add(chunk[c], math::layer_norm_weight_term(xr[c], mean[r], rstd[r], gr[c]));
          chunk[n + c] = rn::add(chunk[n + c], static_cast<double>(gr[c]));
        }
      },
      [&](int o, std::size_t c, float value) { (o == 0 ? dw : db)[c] = value; });
}

}  // namespace

void CpuKernels::layer_norm(const float* x, const float* w, const float* b, std::size_t rows, std::size_t cols, float eps,
                float* out, float* mean, float* rstd) {
  parallel_for(rows, cols, [&](std::size_t first, std::size_t end) { layer_norm_rows(x, w, b, first, end, cols, eps, out, mean, rstd); });
}

void CpuKernels::layer_norm_backward(const float* x, const float* w, const float* mean, const float* rstd, const float* g,
                         std::size_t rows, std::size_t cols, float* dx, float* dw, float* db) {
  parallel_for(rows, cols, [&](std::size_t first, std::size_t end) {
    layer_norm_backward_rows(x, w, mean, rstd, g, first, end, cols, dx);
  });
  // The parameters' gradients: a block of columns per thread, the rows read in order (contiguous),
  // each column's sums in math::layer_norm_params_chunk's arithmetic and the two stages' order.
  parallel_for(cols, rows, [&](std::size_t first, std::size_t end) {
    layer_norm_params_columns(x, mean, rstd, g, rows, cols, first, end, dw, db);
  });
}

}  // namespace course
