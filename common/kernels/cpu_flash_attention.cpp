// FlashAttention-2 on the CPU, walking the tiles the CUDA kernels' blocks walk (kernels/flash.h holds the
// arithmetic both run): a query row meets the keys kFlashTile at a time, in order, and backward goes over
// the pairs once by key rows (dK, dV) and once by query rows (dQ). Each row is one GPU thread's work, so
// this file is how the GPU's result is known before a GPU runs it: kernel_parity_test holds the two to
// the same bits, and flash_attention_test holds this one to plain attention within rounding.
//
// Slower than the CPU's own attention (cpu_attention.cpp, whose GEMMs vectorise), which the CPU backend
// runs by default; ops' sdpa_kernel chooses. One (sequence, head) per task: the same bits at any thread count.
#include "common/kernels/cpu_flash_attention.h"
#include "common/kernels/cpu_kernels.h"

#include <algorithm>
#include <vector>

#include "common/kernels/cpu_vector.h"
#include "common/kernels/flash.h"
#include "common/kernels/parallel.h"

namespace course::cpu {
namespace {

using math::kFlashRows;
using math::kFlashTile;

// One (sequence, head)'s place in the packed projection [B, T, 3, H, hs] and in y [B, T, H, hs].
struct FlashHead {
  const float *q, *k, *v;
  std::int64_t ld, c;
  math::FlashDropout drop;
};

FlashHead flash_head(const float* qkv, const AttentionShape& s, std::int64_t bh) {
  const std::int64_t b = bh / s.heads, h = bh % s.heads, c = s.heads * s.head_size, ld = 3 * c;
  const float* q = qkv + b * s.tokens * ld + h * s.head_size;
  math::FlashDropout drop;
  drop.p = s.dropout, drop.seed = s.seed, drop.tokens = s.tokens;
  drop.base = static_cast<std::uint64_t>(((s.first_sequence + b) * s.heads + h) * s.tokens * s.tokens);
  return {q, q + c, q + 2 * c, ld, c, drop};
}

// The keys of the tile from j0 query i sees.
int visible_in_tile(const AttentionShape& s, std::int64_t i, std::int64_t j0) {
  const std::int64_t n = std::min<std::int64_t>(kFlashTile, s.tokens - j0);
  return static_cast<int>(s.causal ? std::min(n, i - j0 + 1) : n);
}

// The keys a block of queries from i0 needs: with the causal mask, none after its last query.
std::int64_t keys_for_block(const AttentionShape& s, std::int64_t i0) {
  return s.causal ? std::min(s.tokens, i0 + kFlashRows) : s.tokens;
}

template <int D>
COURSE_CPU_CLONES void forward_head(const float* qkv, const AttentionShape& s, std::int64_t bh, float* lse, float* y) {
  const FlashHead head = flash_head(qkv, s, bh);
  const int hs = static_cast<int>(s.head_size);
  const float scale = math::flash_scale(s.head_size);
  const std::int64_t b = bh / s.heads, h = bh % s.heads;
  for (std::int64_t i0 = 0; i0 < s.tokens; i0 += kFlashRows) {
    const std::int64_t last = keys_for_block(s, i0), rows = std::min<std::int64_t>(kFlashRows, s.tokens - i0);
    for (std::int64_t i = i0; i < i0 + rows; ++i) {
      float o[D] = {};
      math::FlashRowState st;
      for (std::int64_t j0 = 0; j0 < last; j0 += kFlashTile)
        math::flash_forward_tile<D>(head.q + i * head.ld, hs, scale, head.k + j0 * head.ld, head.v + j0 * head.ld,
                                    head.ld, visible_in_tile(s, i, j0), i, j0, head.drop, o, st);
      lse[bh * s.tokens + i] = math::flash_finish_row<D>(st, hs, o);
      std::copy(o, o + hs, y + (b * s.tokens + i) * head.c + h * hs);
    }
  }
}

template <int D>
COURSE_CPU_CLONES void backward_head(const float* qkv, const float* y, const float* lse, const float* grad_y,
                                     const AttentionShape& s, std::int64_t bh, float* grad_qkv) {
  const FlashHead head = flash_head(qkv, s, bh);
  const int hs = static_cast<int>(s.head_size);
  const float scale = math::flash_scale(s.head_size);
  const std::int64_t b = bh / s.heads, h = bh % s.heads, t = s.tokens, out_at = b * t * head.c + h * hs;
  const float *yh = y + out_at, *gh = grad_y + out_at, *lh = lse + bh * t;
  const std::int64_t grad_at = b * t * head.ld + h * hs;
  float *dq_h = grad_qkv + grad_at, *dk_h = dq_h + head.c, *dv_h = dq_h + 2 * head.c;
  // delta_i = dy_i . y_i, each row's once (a kernel of its own on the GPU).
  std::vector<float> delta(static_cast<std::size_t>(t));
  for (std::int64_t i = 0; i < t; ++i) delta[i] = math::flash_dot<D>(gh + i * head.c, yh + i * head.c, hs);
  // dK and dV by blocks of keys; each key meets the queries a tile at a time, from the tile holding its
  // block's first key when the mask is causal (the queries before it see none of the block's keys).
  for (std::int64_t j0 = 0; j0 < t; j0 += kFlashRows) {
    const std::int64_t keys = std::min<std::int64_t>(kFlashRows, t - j0), first = s.causal ? j0 / kFlashTile * kFlashTile : 0;
    for (std::int64_t j = j0; j < j0 + keys; ++j) {
      float dk[D] = {}, dv[D] = {};
      for (std::int64_t i0 = first; i0 < t; i0 += kFlashTile) {
        const int count = static_cast<int>(std::min<std::int64_t>(kFlashTile, t - i0));
        const int from = s.causal ? static_cast<int>(std::clamp<std::int64_t>(j - i0, 0, count)) : 0;
        // Every query's gradient of the output is read at y's stride, its q at qkv's: two strides in one
        // call would be a second parameter, so the tile's q and dy are copied as the GPU stages them.
        float qt[kFlashTile * D], gt[kFlashTile * D];
        for (int r = 0; r < count; ++r)
          for (int d = 0; d < hs; ++d)
            qt[r * D + d] = head.q[(i0 + r) * head.ld + d], gt[r * D + d] = gh[(i0 + r) * head.c + d];
        math::flash_grad_kv_tile<D>(head.k + j * head.ld, head.v + j * head.ld, hs, scale, qt, gt, D, lh + i0,
                                    delta.data() + i0, from, count, i0, j, head.drop, dk, dv);
      }
      std::copy(dk, dk + hs, dk_h + j * head.ld);
      std::copy(dv, dv + hs, dv_h + j * head.ld);
    }
  }
  // dQ by blocks of queries, the keys a tile at a time as forward.
  for (std::int64_t i0 = 0; i0 < t; i0 += kFlashRows) {
    const std::int64_t last = keys_for_block(s, i0), rows = std::min<std::int64_t>(kFlashRows, t - i0);
    for (std::int64_t i = i0; i < i0 + rows; ++i) {
      float dq[D] = {};
      for (std::int64_t j0 = 0; j0 < last; j0 += kFlashTile)
        math::flash_grad_q_tile<D>(head.q + i * head.ld, gh + i * head.c, lh[i], delta[i], hs, scale,
                                   head.k + j0 * head.ld, head.v + j0 * head.ld, head.ld, visible_in_tile(s, i, j0),
                                   i, j0, head.drop, dq);
      std::copy(dq, dq + hs, dq_h + i * head.ld);
    }
  }
}

// One task per (sequence, head).
template <class Body>
void for_each_head(const AttentionShape& s, std::size_t cost, Body body) {
  parallel_for(static_cast<std::size_t>(s.batch * s.heads), cost, [&](std::size_t first, std::size_t end) {
    for (auto bh = static_cast<std::int64_t>(first); bh < static_cast<std::int64_t>(end); ++bh) body(bh);
  });
}

}  // namespace

void flash_attention(const float* qkv, const AttentionShape& s, float* lse, float* y) {
  const auto cost = static_cast<std::size_t>(2 * s.tokens * s.tokens * s.head_size);
  for_each_head(s, cost, [&](std::int64_t bh) {
    math::with_flash_width(s.head_size, [&](auto d) { forward_head<decltype(d)::value>(qkv, s, bh, lse, y); });
  });
}

void flash_attention_backward(const float* qkv, const float* y, const float* lse, const float* grad_y,
                              const AttentionShape& s, float* grad_qkv) {
  const auto cost = static_cast<std::size_t>(7 * s.tokens * s.tokens * s.head_size);
  for_each_head(s, cost, [&](std::int64_t bh) {
    math::with_flash_width(s.head_size, [&](auto d) { backward_head<decltype(d)::value>(qkv, y, lse, grad_y, s, bh, grad_qkv); });
  });
}

}  // namespace course::cpu

// The CPU backend's kernels of this family (cpu_kernels.h).
namespace course {
using namespace cpu_loops;

void CpuKernels::flash_attention(const float* qkv, const AttentionShape& shape, float* lse, float* y) {
  cpu::flash_attention(qkv, shape, lse, y);
}

void CpuKernels::flash_attention_backward(const float* qkv, const float* y, const float* lse, const float* grad_y,
                              const AttentionShape& shape, float* grad_qkv) {
  cpu::flash_attention_backward(qkv, y, lse, grad_y, shape, grad_qkv);
}

// A slice of sequences at a time (an eighth of the batch, as the ops slice 16-bit work): widened into
// floats, the float32 kernel, its outputs rounded once. Each sequence's attention is its own, and dropout
// draws by the index in the whole batch (first_sequence), so slicing changes no bit.
void CpuKernels::flash_attention_half(HalfFormat format, const std::uint16_t* qkv, const AttentionShape& s, float* lse,
                          std::uint16_t* y) {
  const std::int64_t width = 3 * s.heads * s.head_size, c = s.heads * s.head_size;
  for_sequence_slices(s, (s.batch + 7) / 8, [&](const AttentionShape& part, std::int64_t first) {
    std::vector<float> wide_qkv = widened(format, qkv + first * s.tokens * width, part.batch * s.tokens * width),
                       wide_y(static_cast<std::size_t>(part.batch * s.tokens * c));
    cpu::flash_attention(wide_qkv.data(), part, lse + first * s.heads * s.tokens, wide_y.data());
    to_half(format, wide_y.data(), y + first * s.tokens * c, wide_y.size());
  });
}

void CpuKernels::flash_attention_backward_half(HalfFormat format, const std::uint16_t* qkv, const std::uint16_t* y,
                                   const float* lse, const std::uint16_t* grad_y, const AttentionShape& s,
                                   std::uint16_t* grad_qkv) {
  const std::int64_t width = 3 * s.heads * s.head_size, c = s.heads * s.head_size;
  for_sequence_slices(s, (s.batch + 7) / 8, [&](const AttentionShape& part, std::int64_t first) {
    const std::int64_t rows = part.batch * s.tokens;
    std::vector<float> wide_qkv = widened(format, qkv + first * s.tokens * width, rows * width),
                       wide_y = widened(format, y + first * s.tokens * c, rows * c),
                       wide_g = widened(format, grad_y + first * s.tokens * c, rows * c),
                       grad(static_cast<std::size_t>(rows * width));
    cpu::flash_attention_backward(wide_qkv.data(), wide_y.data(), lse + first * s.heads * s.tokens, wide_g.data(),
                                  part, grad.data());
    to_half(format, grad.data(), grad_qkv + first * s.tokens * width, grad.size());
  });
}

}  // namespace course
