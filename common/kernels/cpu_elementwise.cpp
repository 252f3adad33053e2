// Element-wise kernels on the CPU: the binary and unary ops, their broadcasts and 16-bit forms, conversions
// and scaling; the shared formulas are math.h's, in explicitly rounded operations.
#include <algorithm>
#include <vector>

#include "common/kernels/cpu_kernels.h"
#include "common/kernels/cpu_vector.h"
#include "common/kernels/rounded.h"

namespace course {
using namespace cpu_loops;

namespace {

// The activations' loops, the most expensive element-wise work of a GPT step (GELU's exp), are compiled
// for AVX2 too (COURSE_CPU_CLONES, cpu_vector.h): the same bits either way.
COURSE_CPU_CLONES void unary_loop(UnaryOp op, const float* in, float* out, std::size_t begin, std::size_t end) {
  switch (op) {
    case UnaryOp::relu:
      for (std::size_t i = begin; i < end; ++i) out[i] = math::unary(UnaryOp::relu, in[i]);
      break;
    case UnaryOp::gelu:
      for (std::size_t i = begin; i < end; ++i) out[i] = math::unary(UnaryOp::gelu, in[i]);
      break;
    case UnaryOp::gelu_tanh:
      for (std::size_t i = begin; i < end; ++i) out[i] = math::unary(UnaryOp::gelu_tanh, in[i]);
      break;
  }
}

COURSE_CPU_CLONES void unary_backward_loop(UnaryOp op, const float* in, const float* g, float* out, std::size_t begin,
                                           std::size_t end) {
  switch (op) {
    case UnaryOp::relu:
      for (std::size_t i = begin; i < end; ++i) out[i] = math::unary_backward(UnaryOp::relu, in[i], g[i]);
      break;
    case UnaryOp::gelu:
      for (std::size_t i = begin; i < end; ++i) out[i] = math::unary_backward(UnaryOp::gelu, in[i], g[i]);
      break;
    case UnaryOp::gelu_tanh:
      for (std::size_t i = begin; i < end; ++i) out[i] = math::unary_backward(UnaryOp::gelu_tanh, in[i], g[i]);
      break;
  }
}

}  // namespace

void CpuKernels::binary(BinaryOp op, const float* a, std::size_t an, const float* b, std::size_t bn, float* out,
            std::size_t n) {
  with_binary_op(op, [&](auto f) {
    if (an == n && bn == n) {  // the common case
      elementwise(n, [&](std::size_t i) { out[i] = f(a[i], b[i]); });
    } else if (an == n && bn > 0 && n % bn == 0) {  // b repeated row by row: a bias, a scalar
      parallel_for(n / bn, bn, [&](std::size_t first, std::size_t end) {
        for (std::size_t r = first * bn; r < end * bn; r += bn)
          for (std::size_t j = 0; j < bn; ++j) out[r + j] = f(a[r + j], b[j]);
      });
    } else if (bn == n && an > 0 && n % an == 0) {
      parallel_for(n / an, an, [&](std::size_t first, std::size_t end) {
        for (std::size_t r = first * an; r < end * an; r += an)
          for (std::size_t j = 0; j < an; ++j) out[r + j] = f(a[j], b[r + j]);
      });
    } else {
      elementwise(n, [&](std::size_t i) { out[i] = f(a[i % an], b[i % bn]); });
    }
  });
}

void CpuKernels::binary_broadcast(BinaryOp op, const float* a, const float* b, float* out, const BroadcastIndex& ix) {
  with_binary_op(op, [&](auto f) {
    for_each_offset(ix, [&](std::int64_t i, std::int64_t ao, std::int64_t bo) { out[i] = f(a[ao], b[bo]); });
  });
}

void CpuKernels::gather(const float* in, float* out, const BroadcastIndex& ix) {
  for_each_offset(ix, [&](std::int64_t i, std::int64_t o, std::int64_t) { out[i] = in[o]; });
}

void CpuKernels::sum_to(const float* in, float* out, std::size_t out_n, const BroadcastIndex& ix) {
  std::vector<double> total(out_n, 0.0);
  for_each_offset_serial(ix, [&](std::int64_t i, std::int64_t o) { total[static_cast<std::size_t>(o)] += in[i]; });
  for (std::size_t j = 0; j < out_n; ++j) out[j] = static_cast<float>(total[j]);
}

void CpuKernels::to_half(HalfFormat format, const float* in, std::uint16_t* out, std::size_t n) {
  parallel_for(n, 1, [&](std::size_t b, std::size_t e) { narrow_into(format, in + b, out + b, e - b); });
}

void CpuKernels::from_half(HalfFormat format, const std::uint16_t* in, float* out, std::size_t n) {
  parallel_for(n, 1, [&](std::size_t b, std::size_t e) { widen_into(format, in + b, out + b, e - b); });
}

void CpuKernels::binary_half(HalfFormat format, BinaryOp op, const std::uint16_t* a, std::size_t an, const std::uint16_t* b,
                 std::size_t bn, std::uint16_t* out, std::size_t n) {
  if (!n) return;
  with_binary_op(op, [&](auto f) {
    in_half_blocks(format, out, n, [&](std::size_t first, std::size_t count, float* results) {
      float wa[kHalfBlock], wb[kHalfBlock];
      widen_repeated(format, a, an, first, count, wa);
      widen_repeated(format, b, bn, first, count, wb);
      for (std::size_t i = 0; i < count; ++i) results[i] = f(wa[i], wb[i]);
    });
  });
}

void CpuKernels::unary_half(HalfFormat format, UnaryOp op, const std::uint16_t* in, std::uint16_t* out, std::size_t n) {
  in_half_blocks(format, out, n, [&](std::size_t first, std::size_t count, float* results) {
    float x[kHalfBlock];
    widen_into(format, in + first, x, count);
    unary_loop(op, x, results, 0, count);
  });
}

void CpuKernels::unary_backward_half(HalfFormat format, UnaryOp op, const std::uint16_t* in, const std::uint16_t* g,
                         std::uint16_t* out, std::size_t n) {
  in_half_blocks(format, out, n, [&](std::size_t first, std::size_t count, float* results) {
    float x[kHalfBlock], gx[kHalfBlock];
    widen_into(format, in + first, x, count);
    widen_into(format, g + first, gx, count);
    unary_backward_loop(op, x, gx, results, 0, count);
  });
}

void CpuKernels::add_half(HalfFormat format, const std::uint16_t* in, float* acc, std::size_t n) {
  parallel_for(n, 1, [&](std::size_t begin, std::size_t end) {
    float x[kHalfBlock];
    for (std::size_t first = begin; first < end; first += kHalfBlock) {
      const std::size_t count = std::min(kHalfBlock, end - first);
      widen_into(format, in + first, x, count);
      for (std::size_t i = 0; i < count; ++i) acc[first + i] = math::binary(BinaryOp::add, acc[first + i], x[i]);
    }
  });
}

void CpuKernels::scale(const float* in, float factor, float* out, std::size_t n) {
  elementwise(n, [&](std::size_t i) { out[i] = rn::mul(in[i], factor); });
}

void CpuKernels::unary(UnaryOp op, const float* in, float* out, std::size_t n) {
  parallel_for(n, 1, [&](std::size_t begin, std::size_t end) { unary_loop(op, in, out, begin, end); });
}

void CpuKernels::unary_backward(UnaryOp op, const float* in, const float* g, float* out, std::size_t n) {
  parallel_for(n, 1, [&](std::size_t begin, std::size_t end) { unary_backward_loop(op, in, g, out, begin, end); });
}

void CpuKernels::scale_by(const float* in, const float* factor, float* out, std::size_t n) {
  if (*factor == 1.0f && in == out) return;
  scale(in, *factor, out, n);
}

}  // namespace course
