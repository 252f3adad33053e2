// The cross-entropy on the CPU: rows.h's row formulas, on float rows or on 16-bit rows widened a row at
// a time (llm.c's fused classifier), and the count of targets that are not ignored.
#include <algorithm>
#include <stdexcept>

#include "common/kernels/cpu_kernels.h"
#include "common/kernels/cpu_vector.h"

namespace course {
using namespace cpu_loops;

namespace {

// Cross-entropy row by row (math::cross_entropy_row, the lanes side by side: the loops vectorise).
COURSE_CPU_CLONES void cross_entropy_rows(const float* logits, const float* targets, std::size_t first, std::size_t end,
                                          std::size_t cols, float* losses) {
  for (std::size_t r = first; r < end; ++r)  // an ignored row (a negative target, ignore_index): no loss
    losses[r] = targets[r] < 0.0f ? 0.0f
                                  : math::cross_entropy_row(math::AllLanes{}, logits + r * cols, cols,
                                                            static_cast<std::size_t>(targets[r]));
}

COURSE_CPU_CLONES void cross_entropy_backward_rows(const float* logits, const float* targets, const float* g,
                                                   std::size_t first, std::size_t end, std::size_t cols, float* out) {
  for (std::size_t r = first; r < end; ++r) {
    float* dst = out + r * cols;
    if (targets[r] < 0.0f) std::fill(dst, dst + cols, 0.0f);  // an ignored row: no gradient
    else math::cross_entropy_backward_row(math::AllLanes{}, logits + r * cols, cols, static_cast<std::size_t>(targets[r]), g[r], dst);
  }
}

// The cross-entropy of one float row (a 16-bit row widened), keeping the row's top and total; and its
// gradient from them. The float32 kernels' formulas; here so that their loops vectorise as those do.
COURSE_CPU_CLONES void cross_entropy_stats_row(const float* row, std::size_t cols, float target, float* loss,
                                               float* top, double* total) {
  const math::RowExpSum e = math::row_exp_sum(math::AllLanes{}, row, cols);
  *top = e.top, *total = e.total;
  *loss = target < 0.0f ? 0.0f : math::cross_entropy_of(e, row, static_cast<std::size_t>(target));
}

COURSE_CPU_CLONES void cross_entropy_backward_stats_row(const float* row, std::size_t cols, std::size_t target, float g,
                                                        float top, double total, float* out) {
  math::cross_entropy_backward_of(math::AllLanes{}, math::RowExpSum{top, total}, row, cols, target, g, out);
}

}  // namespace

void CpuKernels::cross_entropy(const float* logits, const float* targets, std::size_t rows, std::size_t cols,
                   float* losses) {
  parallel_for(rows, cols, [&](std::size_t first, std::size_t end) {
    cross_entropy_rows(logits, targets, first, end, cols, losses);
  });
}

void CpuKernels::cross_entropy_backward(const float* logits, const float* targets, const float* g, std::size_t rows,
                            std::size_t cols, float* out) {
  parallel_for(rows, cols, [&](std::size_t first, std::size_t end) {
    cross_entropy_backward_rows(logits, targets, g, first, end, cols, out);
  });
}

// The 16-bit logits a row at a time, widened (exactly) into a float row: the float32 kernels' loops on
// it, so the same bits, vectorised as those are; the gradient rounded once into 16 bits.
void CpuKernels::cross_entropy_half(HalfFormat format, const std::uint16_t* logits, const float* targets, std::size_t rows,
                        std::size_t cols, float* losses, float* top, double* total) {
  parallel_for(rows, cols, [&](std::size_t first, std::size_t end) {
    for_each_widened_row(format, logits, first, end, cols, [&](std::size_t r, const float* row, float*) {
      cross_entropy_stats_row(row, cols, targets[r], losses + r, top + r, total + r);
    });
  });
}

void CpuKernels::cross_entropy_backward_half(HalfFormat format, const std::uint16_t* logits, const float* targets,
                                 const float* g, const float* top, const double* total, std::size_t rows,
                                 std::size_t cols, std::uint16_t* out) {
  parallel_for(rows, cols, [&](std::size_t first, std::size_t end) {
    for_each_widened_row(format, logits, first, end, cols, [&](std::size_t r, const float* row, float* grad) {
      std::uint16_t* dst = out + r * cols;
      if (targets[r] < 0.0f) {  // an ignored row: no gradient
        std::fill(dst, dst + cols, std::uint16_t{0});
        return;
      }
      cross_entropy_backward_stats_row(row, cols, static_cast<std::size_t>(targets[r]), g[r], top[r], total[r], grad);
      if (format == HalfFormat::bfloat16)
        for (std::size_t c = 0; c < cols; ++c) dst[c] = half::to_bfloat16(grad[c]);
      else
        for (std::size_t c = 0; c < cols; ++c) dst[c] = half::to_float16(grad[c]);
    });
  });
}

void CpuKernels::inverse_count(const float* targets, std::size_t n, float ignore_index, float* inverse) {
  std::size_t kept = 0;
  for (std::size_t i = 0; i < n; ++i) kept += targets[i] != ignore_index;
  if (!kept) throw std::invalid_argument(index_check_message(IndexCheck::every_target_ignored, 0.0f, 0));
  *inverse = 1.0f / static_cast<float>(kept);
}

}  // namespace course
