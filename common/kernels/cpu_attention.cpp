// Self-attention on the CPU, one sequence and head per task, in blocks of kQueryBlock queries, reading q,
// k and v where c_attn wrote them and writing each head's output where c_proj reads it: the GEMMs take
// the packed layout through their leading dimensions, so no permute or copy is made (as FlashAttention's
// kernels read [B, T, H, hs] in place; Dao et al., 2022). With the causal mask a block of queries needs
// only the keys up to its last query, so the score and value GEMMs skip the blocks above the diagonal:
// about half of the work at long sequences. Unlike FlashAttention the probabilities are kept for the
// backward pass (memory for time, as the unfused ops did); the softmax is fused into the same pass.
//
// Every (sequence, head) is computed by one thread in a fixed block order, its GEMMs single-threaded
// inside the threads' region, so the result is the same bits at any thread count (with a single
// sequence and head there is no region, and the GEMM library threads that one task as it likes).
#include "common/kernels/cpu_attention.h"
#include "common/kernels/cpu_kernels.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "common/kernels/cpu_gemm.h"
#include "common/kernels/cpu_vector.h"
#include "common/kernels/math.h"
#include "common/kernels/parallel.h"
#include "common/tensor/random.h"

namespace course::cpu {
namespace {

constexpr std::int64_t kQueryBlock = 64;

// Where one (sequence, head)'s matrices live: q, k and v rows `ld` apart in the packed projection.
struct Head {
  const float *q, *k, *v;
  std::int64_t ld;
};

Head head_of(const float* qkv, const AttentionShape& s, std::int64_t b, std::int64_t h) {
  const std::int64_t c = s.heads * s.head_size, ld = 3 * c;
  const float* q = qkv + b * s.tokens * ld + h * s.head_size;
  return {q, q + c, q + 2 * c, ld};
}

// How many keys query i sees.
std::int64_t visible(const AttentionShape& s, std::int64_t i) { return s.causal ? i + 1 : s.tokens; }

// Rows [first, first + rows) of the scores, in place: softmax over each row's visible keys, 0 after them
// up to `width` (the block's keys: the GEMMs read no further, so the rest of probs is left unwritten).
// The row formula is the GPU's too (kernels/rows.h); its loops vectorise (exp_f32 is arithmetic only).
COURSE_CPU_CLONES void softmax_rows(float* p, std::int64_t ldp, std::int64_t first, std::int64_t rows,
                                    std::int64_t width, const AttentionShape& s) {
  for (std::int64_t r = 0; r < rows; ++r)
    math::attention_softmax_row(math::AllLanes{}, p + r * ldp, static_cast<std::size_t>(visible(s, first + r)),
                                static_cast<std::size_t>(width));
}

// The softmax's gradient, in place over dp: ds = p (dp - sum_j dp_j p_j) scale on the visible keys, 0 after.
COURSE_CPU_CLONES void softmax_backward_rows(const float* p, std::int64_t ldp, float* dp, std::int64_t lddp,
                                             std::int64_t first, std::int64_t rows, std::int64_t width, float scale,
                                             const AttentionShape& s) {
  for (std::int64_t r = 0; r < rows; ++r)
    math::attention_softmax_backward_row(math::AllLanes{}, p + r * ldp, dp + r * lddp,
                                         static_cast<std::size_t>(visible(s, first + r)),
                                         static_cast<std::size_t>(width), scale);
}

// Dropout on rows [first, first + rows) x keys [0, width) of the probabilities of (sequence, head) `bh`:
// out = p * keep, keep = 0 or 1/(1 - p) from the element's index in probs, as the dropout op draws it.
void dropout_rows(const float* p, std::int64_t ldp, float* out, std::int64_t ldo, std::int64_t bh, std::int64_t first,
                  std::int64_t rows, std::int64_t width, const AttentionShape& s) {
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < width; ++c) {
      const auto index = static_cast<std::uint64_t>(((bh + s.first_sequence * s.heads) * s.tokens + first + r) * s.tokens + c);
      out[r * ldo + c] = p[r * ldp + c] * math::dropout_keep(s.seed, index, s.dropout);
    }
}

float scale_of(const AttentionShape& s) { return 1.0f / std::sqrt(static_cast<float>(s.head_size)); }

// Each task's scratch: a block of dropped-out probabilities, a block of score gradients.
thread_local std::vector<float> t_dropped, t_grad_scores;

// What multiplies v for a block of queries: without dropout the probabilities themselves (rows `ld`
// apart), with it a copy with the mask applied (and `ld` becomes `keys`).
const float* weights_of(const float* block, std::int64_t bh, std::int64_t first, std::int64_t rows, std::int64_t keys,
                        const AttentionShape& s, std::int64_t& ld) {
  if (s.dropout == 0.0f) return block;
  t_dropped.resize(static_cast<std::size_t>(rows * keys));
  dropout_rows(block, ld, t_dropped.data(), keys, bh, first, rows, keys, s);
  ld = keys;
  return t_dropped.data();
}

}  // namespace

void attention(const float* qkv, const AttentionShape& s, float* probs, float* y) {
  const std::int64_t t = s.tokens, hs = s.head_size, c = s.heads * hs;
  const float scale = scale_of(s);
  parallel_for(static_cast<std::size_t>(s.batch * s.heads), static_cast<std::size_t>(t * t * hs),
               [&](std::size_t first_task, std::size_t end_task) {
    for (auto bh = static_cast<std::int64_t>(first_task); bh < static_cast<std::int64_t>(end_task); ++bh) {
      const std::int64_t b = bh / s.heads, h = bh % s.heads;
      const Head in = head_of(qkv, s, b, h);
      float* p = probs + bh * t * t;
      float* out = y + b * t * c + h * hs;
      for (std::int64_t i0 = 0; i0 < t; i0 += kQueryBlock) {
        const std::int64_t rows = std::min(kQueryBlock, t - i0), keys = s.causal ? i0 + rows : t;
        float* block = p + i0 * t;
        sgemm(false, true, rows, keys, hs, scale, in.q + i0 * in.ld, in.ld, in.k, in.ld, 0.0f, block, t);  // q k^T
        softmax_rows(block, t, i0, rows, keys, s);
        std::int64_t ldw = t;
        const float* weights = weights_of(block, bh, i0, rows, keys, s, ldw);
        sgemm(false, false, rows, hs, keys, 1.0f, weights, ldw, in.v, in.ld, 0.0f, out + i0 * c, c);  // p v
      }
    }
  });
}

void attention_backward(const float* qkv, const float* probs, const float* grad_y, const AttentionShape& s,
                        float* grad_qkv) {
  const std::int64_t t = s.tokens, hs = s.head_size, c = s.heads * hs;
  const float scale = scale_of(s);
  parallel_for(static_cast<std::size_t>(s.batch * s.heads), static_cast<std::size_t>(2 * t * t * hs),
               [&](std::size_t first_task, std::size_t end_task) {
    for (auto bh = static_cast<std::int64_t>(first_task); bh < static_cast<std::int64_t>(end_task); ++bh) {
      const std::int64_t b = bh / s.heads, h = bh % s.heads;
      const Head in = head_of(qkv, s, b, h);
      // The gradients' places in grad_qkv: the same offsets as q, k and v in qkv.
      float* dq = grad_qkv + (in.q - qkv);
      float* dk = grad_qkv + (in.k - qkv);
      float* dv = grad_qkv + (in.v - qkv);
      for (std::int64_t i = 0; i < t; ++i) {  // dk and dv add up over the query blocks
        std::fill(dk + i * in.ld, dk + i * in.ld + hs, 0.0f);
        std::fill(dv + i * in.ld, dv + i * in.ld + hs, 0.0f);
      }
      const float* p = probs + bh * t * t;
      const float* dy = grad_y + b * t * c + h * hs;
      for (std::int64_t i0 = 0; i0 < t; i0 += kQueryBlock) {
        const std::int64_t rows = std::min(kQueryBlock, t - i0), keys = s.causal ? i0 + rows : t;
        const float* block = p + i0 * t;
        std::int64_t ldw = t;
        const float* weights = weights_of(block, bh, i0, rows, keys, s, ldw);
        sgemm(true, false, keys, hs, rows, 1.0f, weights, ldw, dy + i0 * c, c, 1.0f, dv, in.ld);  // dv += p^T dy
        t_grad_scores.resize(static_cast<std::size_t>(rows * keys));
        float* ds = t_grad_scores.data();
        sgemm(false, true, rows, keys, hs, 1.0f, dy + i0 * c, c, in.v, in.ld, 0.0f, ds, keys);  // dp = dy v^T
        if (s.dropout > 0.0f) {  // through the mask: the gradient reaches only the kept probabilities
          for (std::int64_t r = 0; r < rows; ++r)
            for (std::int64_t j = 0; j < keys; ++j) {
              const auto index = static_cast<std::uint64_t>(((bh + s.first_sequence * s.heads) * t + i0 + r) * t + j);
              ds[r * keys + j] *= math::dropout_keep(s.seed, index, s.dropout);
            }
        }
        softmax_backward_rows(block, t, ds, keys, i0, rows, keys, scale, s);
        sgemm(false, false, rows, hs, keys, 1.0f, ds, keys, in.k, in.ld, 0.0f, dq + i0 * in.ld, in.ld);  // dq = ds k
        sgemm(true, false, keys, hs, rows, 1.0f, ds, keys, in.q + i0 * in.ld, in.ld, 1.0f, dk, in.ld);  // dk += ds^T q
      }
    }
  });
}

}  // namespace course::cpu

// The CPU backend's kernels of this family (cpu_kernels.h).
namespace course {
using namespace cpu_loops;

void CpuKernels::attention(const float* qkv, const AttentionShape& shape, float* probs, float* y) {
  cpu::attention(qkv, shape, probs, y);
}

void CpuKernels::attention_backward(const float* qkv, const float* probs, const float* grad_y, const AttentionShape& shape,
                        float* grad_qkv) {
  cpu::attention_backward(qkv, probs, grad_y, shape, grad_qkv);
}

}  // namespace course
