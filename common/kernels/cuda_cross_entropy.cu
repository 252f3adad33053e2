// The cross-entropy on the GPU: a row in kLanes lanes (rows.h's formulas), on float logits or on 16-bit
// logits read where they lie (llm.c's fused classifier), and the count of targets not ignored.

#include "common/kernels/cuda_kernels.h"
#include "common/kernels/half.h"
#include "common/kernels/rows.h"

namespace course {
using namespace cuda_launch;
namespace {

__global__ void cross_entropy_kernel(const float* logits, const float* targets, std::size_t rows, std::size_t cols,
                                     float* losses) {
  for_each_row_in_lanes(rows, [&](const GroupLanes& lanes, std::size_t r) {
    // An ignored row (or a bad target, raised later): no loss.
    const bool valid = math::valid_index(targets[r], cols, NAN);
    const float loss = valid ? math::cross_entropy_row(lanes, logits + r * cols, cols, static_cast<std::size_t>(targets[r])) : 0.0f;
    if (lanes.lane == 0) losses[r] = loss;
  });
}

__global__ void cross_entropy_backward_kernel(const float* logits, const float* targets, const float* g,
                                              std::size_t rows, std::size_t cols, float* out) {
  for_each_row_in_lanes(rows, [&](const GroupLanes& lanes, std::size_t r) {
    float* dst = out + r * cols;
    if (!math::valid_index(targets[r], cols, NAN)) {  // an ignored row (or a bad target): no gradient
      for (std::size_t c = lanes.first(); c < cols; c += lanes.stride()) dst[c] = 0.0f;
      return;
    }
    math::cross_entropy_backward_row(lanes, logits + r * cols, cols, static_cast<std::size_t>(targets[r]), g[r], dst);
  });
}

// The same on 16-bit logits (Kernels::cross_entropy_half): each row's top and total kept for backward.
template <HalfFormat F>
__global__ void cross_entropy_half_kernel(const std::uint16_t* logits, const float* targets, std::size_t rows,
                                          std::size_t cols, float* losses, float* top, double* total) {
  for_each_row_in_lanes(rows, [&](const GroupLanes& lanes, std::size_t r) {
    const half::In<F> row{logits + r * cols};
    const math::RowExpSum e = math::row_exp_sum(lanes, row, cols);
    const bool valid = math::valid_index(targets[r], cols, NAN);  // an ignored row (or a bad target): no loss
    const float loss = valid ? math::cross_entropy_of(e, row, static_cast<std::size_t>(targets[r])) : 0.0f;
    if (lanes.lane == 0) losses[r] = loss, top[r] = e.top, total[r] = e.total;
  });
}

template <HalfFormat F>
__global__ void cross_entropy_backward_half_kernel(const std::uint16_t* logits, const float* targets, const float* g,
                                                   const float* top, const double* total, std::size_t rows,
                                                   std::size_t cols, std::uint16_t* out) {
  for_each_row_in_lanes(rows, [&](const GroupLanes& lanes, std::size_t r) {
    std::uint16_t* dst = out + r * cols;
    if (!math::valid_index(targets[r], cols, NAN)) {  // an ignored row (or a bad target): no gradient
      for (std::size_t c = lanes.first(); c < cols; c += lanes.stride()) dst[c] = 0;
      return;
    }
    math::cross_entropy_backward_of(lanes, math::RowExpSum{top[r], total[r]}, half::In<F>{logits + r * cols}, cols,
                                    static_cast<std::size_t>(targets[r]), g[r], half::Out<F>{dst});
  });
}

// One block counts the kept targets (integers: the order cannot matter), thread 0 divides.
__global__ void inverse_count_kernel(const float* targets, std::size_t n, float ignore_index, float* inverse,
                                     IndexCheckRecord* record) {
  __shared__ unsigned long long share[kReduceThreads];
  unsigned long long kept = 0;
  for (std::size_t i = threadIdx.x; i < n; i += blockDim.x) kept += targets[i] != ignore_index;
  share[threadIdx.x] = kept;
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) share[threadIdx.x] += share[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x != 0) return;
  if (share[0] == 0) record_failed_check(record, IndexCheck::every_target_ignored, 0.0f, 0);
  *inverse = share[0] ? rn::div(1.0f, static_cast<float>(share[0])) : 0.0f;
}

}  // namespace

void CudaKernels::cross_entropy(const float* logits, const float* targets, std::size_t rows, std::size_t cols,
                   float* losses) {
  if (!rows) return;
  cross_entropy_kernel<<<blocks_for(rows * math::kLanes), kThreads>>>(logits, targets, rows, cols, losses);
  check_launch();
}

void CudaKernels::cross_entropy_backward(const float* logits, const float* targets, const float* g, std::size_t rows,
                            std::size_t cols, float* out) {
  if (!rows) return;
  cross_entropy_backward_kernel<<<blocks_for(rows * math::kLanes), kThreads>>>(logits, targets, g, rows, cols, out);
  check_launch();
}

void CudaKernels::cross_entropy_half(HalfFormat format, const std::uint16_t* logits, const float* targets, std::size_t rows,
                        std::size_t cols, float* losses, float* top, double* total) {
  if (!rows) return;
  half::with_format(format, [&](auto f) {
    cross_entropy_half_kernel<decltype(f)::value><<<blocks_for(rows * math::kLanes), kThreads>>>(
        logits, targets, rows, cols, losses, top, total);
  });
  check_launch();
}

void CudaKernels::cross_entropy_backward_half(HalfFormat format, const std::uint16_t* logits, const float* targets, const float* g,
                                 const float* top, const double* total, std::size_t rows, std::size_t cols,
                                 std::uint16_t* out) {
  if (!rows) return;
  half::with_format(format, [&](auto f) {
    cross_entropy_backward_half_kernel<decltype(f)::value><<<blocks_for(rows * math::kLanes), kThreads>>>(
        logits, targets, g, top, total, rows, cols, out);
  });
  check_launch();
}

void CudaKernels::inverse_count(const float* targets, std::size_t n, float ignore_index, float* inverse) {
  inverse_count_kernel<<<1, kReduceThreads>>>(targets, n, ignore_index, inverse, check_record());
  check_launch();
}

}  // namespace course
