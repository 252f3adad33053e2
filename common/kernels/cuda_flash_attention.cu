// FlashAttention-2 on the GPU (Dao, 2023), in fp32 on the CUDA cores: a block of kFlashRows threads per
// (tile of rows, sequence-head), one thread per row, the other side's rows staged kFlashTile at a time in
// shared memory (read from global memory once per block instead of once per row). The arithmetic is
// kernels/flash.h's, explicitly rounded, so the CPU model (cpu_flash_attention.cpp) walks the same tiles
// to the same bits. A tensor-core version would add in an order of the hardware's; this one keeps the
// course's rule of the same bits everywhere, and stores nothing tokens x tokens.
//
// The kernels read their inputs through `In` and write their outputs through `Out`: float pointers, or
// 16-bit tensors read and written where they lie (half::In, half::Out: each value widened exactly as it
// is staged, each result rounded once as it is stored), so a bf16 step needs no float32 copy of qkv, y or
// their gradients, and its bits are the float32 kernels' on the widened values, rounded.
#include "common/kernels/cuda_flash_attention.h"

#include "common/core/cuda_check.h"
#include "common/kernels/flash.h"
#include "common/kernels/half.h"

namespace course::cuda_flash {
namespace {

using math::kFlashRows;
using math::kFlashTile;

__device__ math::FlashDropout dropout_of(const AttentionShape& s, std::int64_t b, std::int64_t h) {
  math::FlashDropout drop;
  drop.p = s.dropout, drop.seed = s.seed, drop.tokens = s.tokens;
  drop.base = static_cast<std::uint64_t>(((s.first_sequence + b) * s.heads + h) * s.tokens * s.tokens);
  return drop;
}

// A block's place: its (sequence, head), its first row and this thread's, where the head's q begins in the
// packed projection [B, T, 3, H, hs] (k and v c and 2c further), and its dropout draws.
template <class In>
struct BlockPlace {
  std::int64_t t, c, ld, bh, b, h, first, row;
  int hs;
  In base;
  math::FlashDropout drop;
};

template <class In>
__device__ BlockPlace<In> place_of(In qkv, const AttentionShape& s) {
  BlockPlace<In> p;
  p.t = s.tokens, p.c = s.heads * s.head_size, p.ld = 3 * p.c, p.bh = blockIdx.x, p.b = p.bh / s.heads;
  p.h = p.bh % s.heads, p.first = static_cast<std::int64_t>(blockIdx.y) * kFlashRows, p.row = p.first + threadIdx.x;
  p.hs = static_cast<int>(s.head_size);
  p.base = qkv + p.b * p.t * p.ld + p.h * p.hs;
  p.drop = dropout_of(s, p.b, p.h);
  return p;
}

// Rows [first, first + n) of a matrix whose rows lie `ld` apart, `hs` wide, into shared memory at
// stride D (zeros past hs), by the whole block (consecutive threads read consecutive floats).
template <int D, class In>
__device__ void stage(In from, std::int64_t ld, std::int64_t first, int n, int hs, float* to) {
  for (int e = threadIdx.x; e < kFlashTile * D; e += blockDim.x) {
    const int r = e / D, d = e % D;
    to[e] = r < n && d < hs ? from[(first + r) * ld + d] : 0.0f;
  }
}

__device__ int visible_in_tile(const AttentionShape& s, std::int64_t i, std::int64_t j0) {
  const std::int64_t n = min(static_cast<std::int64_t>(kFlashTile), s.tokens - j0);
  return static_cast<int>(s.causal ? min(n, i - j0 + 1) : n);
}

// Forward's and dQ's walk: the keys a block of queries needs (none after its last query when causal),
// staged kFlashTile at a time into ks and vs by the whole block; body(j0, visible) for this thread's row,
// where it is one (visible: the keys of the tile from j0 that it sees).
template <int D, class In, class Body>
__device__ void for_each_key_tile(const AttentionShape& s, const BlockPlace<In>& p, float* ks, float* vs, Body body) {
  const std::int64_t last = s.causal ? min(p.t, p.first + kFlashRows) : p.t;
  for (std::int64_t j0 = 0; j0 < last; j0 += kFlashTile) {
    const int n = static_cast<int>(min(static_cast<std::int64_t>(kFlashTile), last - j0));
    __syncthreads();  // the last tile read by every thread
    stage<D>(p.base + p.c, p.ld, j0, n, p.hs, ks);
    stage<D>(p.base + 2 * p.c, p.ld, j0, n, p.hs, vs);
    __syncthreads();
    if (p.row < p.t) body(j0, visible_in_tile(s, p.row, j0));
  }
}

template <int D, class In, class Out>
__global__ void __launch_bounds__(kFlashRows) flash_forward_kernel(In qkv, AttentionShape s, float scale, float* lse,
                                                                   Out y) {
  __shared__ float ks[kFlashTile * D], vs[kFlashTile * D];
  const BlockPlace<In> p = place_of(qkv, s);
  const std::int64_t t = p.t, i = p.row;
  const int hs = p.hs;
  float q[D], o[D];
COURSE_UNROLL
  for (int d = 0; d < D; ++d) q[d] = i < t && d < hs ? p.base[i * p.ld + d] : 0.0f, o[d] = 0.0f;
  math::FlashRowState st;
  for_each_key_tile<D>(s, p, ks, vs, [&](std::int64_t j0, int visible) {
    math::flash_forward_tile<D>(q, hs, scale, ks, vs, D, visible, i, j0, p.drop, o, st);
  });
  if (i >= t) return;
  lse[p.bh * t + i] = math::flash_finish_row<D>(st, hs, o);
  const Out out = y + ((p.b * t + i) * p.c + p.h * hs);
COURSE_UNROLL
  for (int d = 0; d < D; ++d)
    if (d < hs) out[d] = o[d];
}

// delta_i = dy_i . y_i, a thread per query row.
template <int D, class In>
__global__ void flash_delta_kernel(In y, In grad_y, AttentionShape s, float* delta) {
  const std::int64_t t = s.tokens, c = s.heads * s.head_size, rows = s.batch * s.heads * t;
  for (std::int64_t r = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; r < rows;
       r += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t bh = r / t, i = r % t, b = bh / s.heads, h = bh % s.heads, at = (b * t + i) * c + h * s.head_size;
    delta[r] = math::flash_dot<D>(grad_y + at, y + at, static_cast<int>(s.head_size));
  }
}

// dK and dV, a thread per key row, the queries staged a tile at a time with their lse and delta.
template <int D, class In, class Out>
__global__ void __launch_bounds__(kFlashRows) flash_grad_kv_kernel(In qkv, In grad_y, const float* lse,
                                                                   const float* delta, AttentionShape s, float scale,
                                                                   Out grad_qkv) {
  __shared__ float qs[kFlashTile * D], gs[kFlashTile * D], ls[kFlashTile], ds[kFlashTile];
  const BlockPlace<In> p = place_of(qkv, s);
  const std::int64_t t = p.t, c = p.c, ld = p.ld, bh = p.bh, b = p.b, j0 = p.first, j = p.row;
  const int hs = p.hs;
  const In base = p.base;
  const In g = grad_y + (b * t * c + p.h * hs);
  const math::FlashDropout& drop = p.drop;
  float k[D], v[D], dk[D], dv[D];
COURSE_UNROLL
  for (int d = 0; d < D; ++d) {
    k[d] = j < t && d < hs ? base[j * ld + c + d] : 0.0f;
    v[d] = j < t && d < hs ? base[j * ld + 2 * c + d] : 0.0f;
    dk[d] = dv[d] = 0.0f;
  }
  for (std::int64_t i0 = s.causal ? j0 / kFlashTile * kFlashTile : 0; i0 < t; i0 += kFlashTile) {
    const int n = static_cast<int>(min(static_cast<std::int64_t>(kFlashTile), t - i0));
    __syncthreads();
    stage<D>(base, ld, i0, n, hs, qs);
    stage<D>(g, c, i0, n, hs, gs);
    if (threadIdx.x < n) ls[threadIdx.x] = lse[bh * t + i0 + threadIdx.x], ds[threadIdx.x] = delta[bh * t + i0 + threadIdx.x];
    __syncthreads();
    if (j < t) {
      const int from = s.causal ? static_cast<int>(max(static_cast<std::int64_t>(0), min(j - i0, static_cast<std::int64_t>(n)))) : 0;
      math::flash_grad_kv_tile<D>(k, v, hs, scale, qs, gs, D, ls, ds, from, n, i0, j, drop, dk, dv);
    }
  }
  if (j >= t) return;
  const Out out = grad_qkv + (b * t * ld + j * ld + p.h * hs);
COURSE_UNROLL
  for (int d = 0; d < D; ++d)
    if (d < hs) out[c + d] = dk[d], out[2 * c + d] = dv[d];
}

// dQ, a thread per query row, the keys staged a tile at a time as forward.
template <int D, class In, class Out>
__global__ void __launch_bounds__(kFlashRows) flash_grad_q_kernel(In qkv, In grad_y, const float* lse,
                                                                  const float* delta, AttentionShape s, float scale,
                                                                  Out grad_qkv) {
  __shared__ float ks[kFlashTile * D], vs[kFlashTile * D];
  const BlockPlace<In> p = place_of(qkv, s);
  const std::int64_t t = p.t, i = p.row;
  const int hs = p.hs;
  float q[D], dy[D], dq[D];
COURSE_UNROLL
  for (int d = 0; d < D; ++d) {
    q[d] = i < t && d < hs ? p.base[i * p.ld + d] : 0.0f;
    dy[d] = i < t && d < hs ? grad_y[(p.b * t + i) * p.c + p.h * hs + d] : 0.0f;
    dq[d] = 0.0f;
  }
  const float row_lse = i < t ? lse[p.bh * t + i] : 0.0f, row_delta = i < t ? delta[p.bh * t + i] : 0.0f;
  for_each_key_tile<D>(s, p, ks, vs, [&](std::int64_t j0, int visible) {
    math::flash_grad_q_tile<D>(q, dy, row_lse, row_delta, hs, scale, ks, vs, D, visible, i, j0, p.drop, dq);
  });
  if (i >= t) return;
  const Out out = grad_qkv + (p.b * t * p.ld + i * p.ld + p.h * hs);
COURSE_UNROLL
  for (int d = 0; d < D; ++d)
    if (d < hs) out[d] = dq[d];
}

std::int64_t row_tiles(const AttentionShape& s) { return (s.tokens + kFlashRows - 1) / kFlashRows; }

// The sequence-heads along x (up to 2^31 - 1 blocks), the tiles of rows along y (up to 65535).
dim3 grid_of(const AttentionShape& s) {
  return dim3(static_cast<unsigned>(s.batch * s.heads), static_cast<unsigned>(row_tiles(s)));
}

void check_shape(const AttentionShape& s) {
  if (s.head_size > math::kFlashMaxHeadSize || row_tiles(s) > 65535 || s.batch * s.heads > 2147483647)
    throw std::invalid_argument("flash attention: head size " + std::to_string(s.head_size) + " (at most " +
                                std::to_string(math::kFlashMaxHeadSize) + "), " + std::to_string(s.tokens) +
                                " tokens (at most " + std::to_string(65535 * kFlashRows) + ") or " +
                                std::to_string(s.batch * s.heads) + " sequence-heads (at most 2^31 - 1)");
}

template <int D, class In, class Out>
void forward_for(In qkv, const AttentionShape& s, float* lse, Out y) {
  flash_forward_kernel<D><<<grid_of(s), kFlashRows>>>(qkv, s, math::flash_scale(s.head_size), lse, y);
  COURSE_CUDA_CHECK(cudaGetLastError());
}

template <int D, class In, class Out>
void backward_for(In qkv, In y, const float* lse, In grad_y, const AttentionShape& s, float* delta, Out grad_qkv) {
  const float scale = math::flash_scale(s.head_size);
  const std::int64_t rows = s.batch * s.heads * s.tokens;
  flash_delta_kernel<D><<<static_cast<unsigned>(min(static_cast<std::int64_t>(65535), (rows + 255) / 256)), 256>>>(
      y, grad_y, s, delta);
  COURSE_CUDA_CHECK(cudaGetLastError());
  flash_grad_kv_kernel<D><<<grid_of(s), kFlashRows>>>(qkv, grad_y, lse, delta, s, scale, grad_qkv);
  COURSE_CUDA_CHECK(cudaGetLastError());
  flash_grad_q_kernel<D><<<grid_of(s), kFlashRows>>>(qkv, grad_y, lse, delta, s, scale, grad_qkv);
  COURSE_CUDA_CHECK(cudaGetLastError());
}

// Either element type, by the width of the head's compiled kernels.
template <class In, class Out>
void forward_in(In qkv, const AttentionShape& s, float* lse, Out y) {
  if (s.batch * s.heads * s.tokens * s.head_size == 0) return;
  check_shape(s);
  math::with_flash_width(s.head_size, [&](auto d) { forward_for<decltype(d)::value>(qkv, s, lse, y); });
}
template <class In, class Out>
void backward_in(In qkv, In y, const float* lse, In grad_y, const AttentionShape& s, float* delta, Out grad_qkv) {
  if (s.batch * s.heads * s.tokens * s.head_size == 0) return;
  check_shape(s);
  math::with_flash_width(s.head_size, [&](auto d) { backward_for<decltype(d)::value>(qkv, y, lse, grad_y, s, delta, grad_qkv); });
}

}  // namespace

void forward(const float* qkv, const AttentionShape& s, float* lse, float* y) { forward_in(qkv, s, lse, y); }

void backward(const float* qkv, const float* y, const float* lse, const float* grad_y, const AttentionShape& s,
              float* delta, float* grad_qkv) {
  backward_in(qkv, y, lse, grad_y, s, delta, grad_qkv);
}

void forward_half(HalfFormat format, const std::uint16_t* qkv, const AttentionShape& s, float* lse, std::uint16_t* y) {
  half::with_format(format, [&](auto f) {
    constexpr HalfFormat F = decltype(f)::value;
    forward_in(half::In<F>{qkv}, s, lse, half::Out<F>{y});
  });
}

void backward_half(HalfFormat format, const std::uint16_t* qkv, const std::uint16_t* y, const float* lse,
                   const std::uint16_t* grad_y, const AttentionShape& s, float* delta, std::uint16_t* grad_qkv) {
  half::with_format(format, [&](auto f) {
    constexpr HalfFormat F = decltype(f)::value;
    backward_in(half::In<F>{qkv}, half::In<F>{y}, lse, half::In<F>{grad_y}, s, delta, half::Out<F>{grad_qkv});
  });
}

}  // namespace course::cuda_flash
