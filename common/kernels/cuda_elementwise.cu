// Element-wise kernels on the GPU, a thread per element: the binary and unary ops, their broadcasts and
// 16-bit forms, conversions and scaling, each math.h's formula in explicitly rounded operations.

#include "common/kernels/cuda_kernels.h"
#include "common/kernels/half.h"

namespace course {
using namespace cuda_launch;
namespace {

__global__ void to_half_kernel(HalfFormat format, const float* in, std::uint16_t* out, std::size_t n) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    out[i] = format == HalfFormat::float16 ? half::to_float16(in[i]) : half::to_bfloat16(in[i]);
}

__global__ void from_half_kernel(HalfFormat format, const std::uint16_t* in, float* out, std::size_t n) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    out[i] = format == HalfFormat::float16 ? half::from_float16(in[i]) : half::from_bfloat16(in[i]);
}

__global__ void binary_kernel(BinaryOp op, const float* a, std::size_t an, const float* b, std::size_t bn,
                              float* out, std::size_t n) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    out[i] = math::binary(op, a[an == n ? i : i % an], b[bn == n ? i : i % bn]);
  }
}

// The 16-bit element-wise kernels (Kernels::binary_half, ...): the float32 kernels' formulas on the exact
// widening of each value, each result rounded once; the format a template argument, so no branch per element.
template <HalfFormat F>
__global__ void binary_half_kernel(BinaryOp op, const std::uint16_t* a, std::size_t an, const std::uint16_t* b,
                                   std::size_t bn, std::uint16_t* out, std::size_t n) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    out[i] = half::narrow<F>(math::binary(op, half::widen<F>(a[an == n ? i : i % an]), half::widen<F>(b[bn == n ? i : i % bn])));
}

template <HalfFormat F>
__global__ void unary_half_kernel(UnaryOp op, const std::uint16_t* in, std::uint16_t* out, std::size_t n) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    out[i] = half::narrow<F>(math::unary(op, half::widen<F>(in[i])));
}

template <HalfFormat F>
__global__ void unary_backward_half_kernel(UnaryOp op, const std::uint16_t* in, const std::uint16_t* g,
                                           std::uint16_t* out, std::size_t n) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    out[i] = half::narrow<F>(math::unary_backward(op, half::widen<F>(in[i]), half::widen<F>(g[i])));
}

template <HalfFormat F>
__global__ void add_half_kernel(const std::uint16_t* in, float* acc, std::size_t n) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    acc[i] = math::binary(BinaryOp::add, acc[i], half::widen<F>(in[i]));
}

__global__ void scale_kernel(const float* in, float factor, float* out, std::size_t n) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    out[i] = rn::mul(in[i], factor);
}

__global__ void unary_kernel(UnaryOp op, const float* in, float* out, std::size_t n) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    out[i] = math::unary(op, in[i]);
}

__global__ void unary_backward_kernel(UnaryOp op, const float* in, const float* g, float* out, std::size_t n) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    out[i] = math::unary_backward(op, in[i], g[i]);
}

// One thread per output element: its multi-index gives each operand's offset.
__global__ void binary_broadcast_kernel(BinaryOp op, const float* a, const float* b, float* out, BroadcastIndex ix,
                                        std::int64_t n) {
  for (std::int64_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    std::int64_t rest = i, ao = 0, bo = 0;
    for (int d = ix.rank - 1; d >= 0; --d) {
      const std::int64_t k = rest % ix.dims[d];
      rest /= ix.dims[d];
      ao += k * ix.a_strides[d];
      bo += k * ix.b_strides[d];
    }
    out[i] = math::binary(op, a[ao], b[bo]);
  }
}

__global__ void gather_kernel(const float* in, float* out, BroadcastIndex ix, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    std::int64_t rest = i, o = 0;
    for (int d = ix.rank - 1; d >= 0; --d) {
      o += (rest % ix.dims[d]) * ix.a_strides[d];
      rest /= ix.dims[d];
    }
    out[i] = in[o];
  }
}

// One thread per output element j: its kept dimensions come from j, and the reduced ones (stride 0)
// are walked in row-major order, so the in elements arrive in increasing index, in double, as on the CPU.
__global__ void sum_to_kernel(const float* in, float* out, std::size_t out_n, BroadcastIndex ix) {
  const std::size_t j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= out_n) return;
  std::int64_t in_strides[kMaxDims], reduced_count = 1, base = 0;
  std::int64_t stride = 1;
  for (int d = ix.rank - 1; d >= 0; --d) {
    in_strides[d] = stride;
    stride *= ix.dims[d];
  }
  std::int64_t rest = static_cast<std::int64_t>(j);
  for (int d = ix.rank - 1; d >= 0; --d) {
    if (ix.a_strides[d] == 0) {
      reduced_count *= ix.dims[d];
      continue;
    }
    const std::int64_t k = rest % ix.dims[d];
    rest /= ix.dims[d];
    base += k * in_strides[d];
  }
  double total = 0.0;
  for (std::int64_t r = 0; r < reduced_count; ++r) {
    std::int64_t left = r, offset = base;
    for (int d = ix.rank - 1; d >= 0; --d) {
      if (ix.a_strides[d] != 0) continue;
      offset += (left % ix.dims[d]) * in_strides[d];
      left /= ix.dims[d];
    }
    total += in[offset];
  }
  out[j] = static_cast<float>(total);
}

// A factor of 1 in place changes nothing: the kernel returns at once (clipping that did not clip).
__global__ void scale_by_kernel(const float* in, const float* factor, float* out, std::size_t n) {
  const float f = *factor;
  if (f == 1.0f && in == out) return;
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    out[i] = rn::mul(in[i], f);
}

}  // namespace

void CudaKernels::binary(BinaryOp op, const float* a, std::size_t an, const float* b, std::size_t bn, float* out,
            std::size_t n) {
  if (!n) return;
  binary_kernel<<<blocks_for(n), kThreads>>>(op, a, an, b, bn, out, n);
  check_launch();
}

void CudaKernels::binary_broadcast(BinaryOp op, const float* a, const float* b, float* out, const BroadcastIndex& ix) {
  std::int64_t n = 1;
  for (int d = 0; d < ix.rank; ++d) n *= ix.dims[d];
  if (!n) return;
  binary_broadcast_kernel<<<blocks_for(static_cast<std::size_t>(n)), kThreads>>>(op, a, b, out, ix, n);
  check_launch();
}

void CudaKernels::gather(const float* in, float* out, const BroadcastIndex& ix) {
  std::int64_t n = 1;
  for (int d = 0; d < ix.rank; ++d) n *= ix.dims[d];
  if (!n) return;
  gather_kernel<<<blocks_for(static_cast<std::size_t>(n)), kThreads>>>(in, out, ix, n);
  check_launch();
}

void CudaKernels::sum_to(const float* in, float* out, std::size_t out_n, const BroadcastIndex& ix) {
  if (!out_n) return;
  sum_to_kernel<<<blocks_for(out_n), kThreads>>>(in, out, out_n, ix);
  check_launch();
}

void CudaKernels::scale(const float* in, float factor, float* out, std::size_t n) {
  if (!n) return;
  scale_kernel<<<blocks_for(n), kThreads>>>(in, factor, out, n);
  check_launch();
}

void CudaKernels::to_half(HalfFormat format, const float* in, std::uint16_t* out, std::size_t n) {
  if (!n) return;
  to_half_kernel<<<blocks_for(n), kThreads>>>(format, in, out, n);
  check_launch();
}

void CudaKernels::from_half(HalfFormat format, const std::uint16_t* in, float* out, std::size_t n) {
  if (!n) return;
  from_half_kernel<<<blocks_for(n), kThreads>>>(format, in, out, n);
  check_launch();
}

void CudaKernels::binary_half(HalfFormat format, BinaryOp op, const std::uint16_t* a, std::size_t an, const std::uint16_t* b,
                 std::size_t bn, std::uint16_t* out, std::size_t n) {
  if (!n) return;
  half::with_format(format, [&](auto f) {
    binary_half_kernel<decltype(f)::value><<<blocks_for(n), kThreads>>>(op, a, an, b, bn, out, n);
  });
  check_launch();
}

void CudaKernels::unary_half(HalfFormat format, UnaryOp op, const std::uint16_t* in, std::uint16_t* out, std::size_t n) {
  if (!n) return;
  half::with_format(format, [&](auto f) { unary_half_kernel<decltype(f)::value><<<blocks_for(n), kThreads>>>(op, in, out, n); });
  check_launch();
}

void CudaKernels::unary_backward_half(HalfFormat format, UnaryOp op, const std::uint16_t* in, const std::uint16_t* g,
                         std::uint16_t* out, std::size_t n) {
  if (!n) return;
  half::with_format(format, [&](auto f) {
    unary_backward_half_kernel<decltype(f)::value><<<blocks_for(n), kThreads>>>(op, in, g, out, n);
  });
  check_launch();
}

void CudaKernels::add_half(HalfFormat format, const std::uint16_t* in, float* acc, std::size_t n) {
  if (!n) return;
  half::with_format(format, [&](auto f) { add_half_kernel<decltype(f)::value><<<blocks_for(n), kThreads>>>(in, acc, n); });
  check_launch();
}

void CudaKernels::unary(UnaryOp op, const float* in, float* out, std::size_t n) {
  if (!n) return;
  unary_kernel<<<blocks_for(n), kThreads>>>(op, in, out, n);
  check_launch();
}

void CudaKernels::unary_backward(UnaryOp op, const float* in, const float* g, float* out, std::size_t n) {
  if (!n) return;
  unary_backward_kernel<<<blocks_for(n), kThreads>>>(op, in, g, out, n);
  check_launch();
}

void CudaKernels::scale_by(const float* in, const float* factor, float* out, std::size_t n) {
  if (!n) return;
  scale_by_kernel<<<blocks_for(n), kThreads>>>(in, factor, out, n);
  check_launch();
}

}  // namespace course
