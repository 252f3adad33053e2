// FlashAttention-2's tiles, one row at a time, written once for the CPU model (cpu_flash_attention.cpp)
// and the CUDA kernels (cuda_flash_attention.cu), so that both devices give the same bits.
//
// The algorithm (Dao, "FlashAttention-2: Faster Attention with Better Parallelism and Work Partitioning",
// 2023, algorithms 1 and 2): a query row meets the keys a tile of kFlashTile at a time and folds each tile
// into a running maximum m, a running sum l of exp(score - m) and a running output o, rescaling the
// three by exp(m_old - m_new) when the maximum grows (the online softmax, Milakov & Gimelshein, 2018).
// Nothing of size tokens x tokens is ever stored: forward keeps each row's log-sum-exp, and backward
// computes each probability again from it, p = exp(score - lse). Backward runs twice over the pairs,
// once by key rows (dK and dV: each key's sums over the queries in order) and once by query rows (dQ),
// where FlashAttention-2 adds dQ with atomics: a fixed order instead, so the gradient is deterministic.
//
// Every operation is explicitly rounded (rounded.h: no multiply-add is fused, on either device) and every
// sum runs in one order: a dot product over the head's dimensions in order, a row's keys (or a key's
// queries) in order, the rescaling once per tile. The tile size is therefore part of the arithmetic:
// the CPU model walks the same tiles as the GPU's blocks.
#pragma once
#include <cstdint>
#include <type_traits>

#include "common/kernels/math.h"
#include "common/kernels/rounded.h"
#include "common/kernels/rows.h"

// nvcc unrolls the loops over a row's D values, so that the row stays in registers, and not the loops
// over a tile's keys or queries: unrolled too, the forward kernel alone took nvcc minutes to compile
// for every width, and a tile's 32 scores sit in (cached) local memory as well as in registers. The host
// compiler does as it likes; the order of the operations is the same either way.
#ifdef __CUDA_ARCH__
#define COURSE_UNROLL _Pragma("unroll")
#define COURSE_UNROLL_NOT _Pragma("unroll 1")
#else
#define COURSE_UNROLL
#define COURSE_UNROLL_NOT
#endif

namespace course::math {

constexpr int kFlashRows = 64;  // rows to a GPU block (queries forward and for dQ, keys for dK and dV): a thread each
constexpr int kFlashTile = 32;  // the other side's rows staged at a time (keys forward and for dQ, queries for dK, dV)
// The kernels are compiled for head sizes up to D = 16, 32, 64 and 128 (a row in registers); a head size
// h runs on the smallest D >= h. Larger heads take the kernel that keeps the probabilities.
constexpr std::int64_t kFlashMaxHeadSize = 128;
COURSE_HOST_DEVICE constexpr int flash_width(std::int64_t head_size) {
  return head_size <= 16 ? 16 : head_size <= 32 ? 32 : head_size <= 64 ? 64 : 128;
}

// f(std::integral_constant<int, D>{}) for the head size's D: how both devices pick their compiled width.
template <class F>
decltype(auto) with_flash_width(std::int64_t head_size, F f) {
  switch (flash_width(head_size)) {
    case 16: return f(std::integral_constant<int, 16>{});
    case 32: return f(std::integral_constant<int, 32>{});
    case 64: return f(std::integral_constant<int, 64>{});
    default: return f(std::integral_constant<int, 128>{});
  }
}

// The scores' scale, 1/sqrt(head size), correctly rounded on both devices.
COURSE_HOST_DEVICE inline float flash_scale(std::int64_t head_size) {
  return rn::div(1.0f, rn::sqrt(static_cast<float>(head_size)));
}

// a . b over the first `hs` of D dimensions, in order (a and b: float rows, or 16-bit ones read through
// half::In).
template <int D, class A, class B>
COURSE_HOST_DEVICE inline float flash_dot(A a, B b, int hs) {
  float s = 0.0f;
COURSE_UNROLL
  for (int d = 0; d < D; ++d)
    if (d < hs) s = rn::add(s, rn::mul(a[d], b[d]));
  return s;
}

// Attention's dropout, drawn as the dropout op draws it: probability (i, j) of sequence-head `bh` (in the
// whole batch) has index (bh T + i) T + j in probs [B, H, T, T], and is kept with factor 1/(1 - p).
struct FlashDropout {
  float p = 0.0f;
  std::uint64_t seed = 0, base = 0;  // base: bh T T
  std::int64_t tokens = 0;
  COURSE_HOST_DEVICE float keep(std::int64_t i, std::int64_t j) const {
    return p > 0.0f ? dropout_keep(seed, base + static_cast<std::uint64_t>(i * tokens + j), p) : 1.0f;
  }
};

// A query row's running softmax: the largest score seen and the sum of exp(score - m) over the keys seen.
struct FlashRowState {
  float m = -INFINITY, l = 0.0f;
};

// Forward: query row i (q, `hs` of D values) takes in keys [first_key, first_key + visible), rows `ld`
// apart in k and v (the keys the mask lets it see in this tile; none: nothing changes). o is the row's
// running output, sum_j exp(score_j - m) keep_ij v_j.
template <int D>
COURSE_HOST_DEVICE inline void flash_forward_tile(const float* q, int hs, float scale, const float* k, const float* v,
                                                  std::int64_t ld, int visible, std::int64_t i, std::int64_t first_key,
                                                  const FlashDropout& drop, float* o, FlashRowState& st) {
  using namespace rn;
  if (visible <= 0) return;
  float s[kFlashTile];
  float top = st.m;
COURSE_UNROLL_NOT
  for (int j = 0; j < kFlashTile; ++j)
    if (j < visible) {
      s[j] = mul(flash_dot<D>(q, k + j * ld, hs), scale);
      top = top < s[j] ? s[j] : top;
    }
  // The sums so far were taken against the old maximum: rescale them to the new one.
  const float correction = st.m == -INFINITY ? 0.0f : exp_f32(sub(st.m, top));
  float l = mul(st.l, correction);
COURSE_UNROLL
  for (int d = 0; d < D; ++d) o[d] = mul(o[d], correction);
COURSE_UNROLL_NOT
  for (int j = 0; j < kFlashTile; ++j)
    if (j < visible) {
      const float p = exp_f32(sub(s[j], top));
      l = add(l, p);
      const float w = mul(p, drop.keep(i, first_key + j));
COURSE_UNROLL
      for (int d = 0; d < D; ++d)
        if (d < hs) o[d] = add(o[d], mul(w, v[j * ld + d]));
    }
  st.m = top, st.l = l;
}

// After the last tile: o /= l, and the row's log-sum-exp m + log l (in double, log_f64: the same bits on
// both devices), all that backward keeps of the probabilities.
template <int D>
COURSE_HOST_DEVICE inline float flash_finish_row(const FlashRowState& st, int hs, float* o) {
COURSE_UNROLL
  for (int d = 0; d < D; ++d)
    if (d < hs) o[d] = rn::div(o[d], st.l);
  return static_cast<float>(rn::add(static_cast<double>(st.m), log_f64(static_cast<double>(st.l))));
}

// Backward's pieces for the pair (query i, key j): the probability again from the row's lse, and the
// score's gradient ds = p (dp - delta) scale, with dp = keep (dy_i . v_j) and delta = dy_i . y_i
// (FlashAttention's rowsum(dO * O), which equals sum_j p_ij dp_ij with or without dropout).
template <int D>
COURSE_HOST_DEVICE inline float flash_probability(const float* q, const float* k, int hs, float scale, float lse) {
  return exp_f32(rn::sub(rn::mul(flash_dot<D>(q, k, hs), scale), lse));
}
template <int D>
COURSE_HOST_DEVICE inline float flash_score_gradient(float p, float keep, const float* dy, const float* v, int hs,
                                                     float delta, float scale) {
  using namespace rn;
  return mul(mul(p, sub(mul(flash_dot<D>(dy, v, hs), keep), delta)), scale);
}

// dQ: query row i (q, dy, its lse and delta) takes in keys [first_key, first_key + visible), adding
// ds_ij k_j to dq in key order.
template <int D>
COURSE_HOST_DEVICE inline void flash_grad_q_tile(const float* q, const float* dy, float lse, float delta, int hs,
                                                 float scale, const float* k, const float* v, std::int64_t ld,
                                                 int visible, std::int64_t i, std::int64_t first_key,
                                                 const FlashDropout& drop, float* dq) {
  using namespace rn;
COURSE_UNROLL_NOT
  for (int j = 0; j < visible; ++j) {
    const float* kj = k + j * ld;
    const float p = flash_probability<D>(q, kj, hs, scale, lse);
    const float ds = flash_score_gradient<D>(p, drop.keep(i, first_key + j), dy, v + j * ld, hs, delta, scale);
COURSE_UNROLL
    for (int d = 0; d < D; ++d)
      if (d < hs) dq[d] = add(dq[d], mul(ds, kj[d]));
  }
}

// dK and dV: key row j (k, v) takes in queries [first_query + from, first_query + count) of a tile, rows
// `ld` apart in q and dy (lse and delta the tile's, one apart), adding ds_ij q_i to dk and
// p_ij keep_ij dy_i to dv in query order.
template <int D>
COURSE_HOST_DEVICE inline void flash_grad_kv_tile(const float* k, const float* v, int hs, float scale, const float* q,
                                                  const float* dy, std::int64_t ld, const float* lse,
                                                  const float* delta, int from, int count, std::int64_t first_query,
                                                  std::int64_t j, const FlashDropout& drop, float* dk, float* dv) {
  using namespace rn;
COURSE_UNROLL_NOT
  for (int r = from; r < count; ++r) {
    const float *qi = q + r * ld, *dyi = dy + r * ld;
    const float p = flash_probability<D>(qi, k, hs, scale, lse[r]);
    const float keep = drop.keep(first_query + r, j);
    const float ds = flash_score_gradient<D>(p, keep, dyi, v, hs, delta[r], scale);
    const float w = mul(p, keep);
COURSE_UNROLL
    for (int d = 0; d < D; ++d)
      if (d < hs) {
        dv[d] = add(dv[d], mul(w, dyi[d]));
        dk[d] = add(dk[d], mul(ds, qi[d]));
      }
  }
}

}  // namespace course::math
