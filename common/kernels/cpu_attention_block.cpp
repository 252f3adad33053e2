// Ring attention's blocks on the CPU, one (sequence, head) per task as cpu_attention.cpp, in blocks of
// kQueryBlock queries: the scores of a block of queries against the block of keys by one GEMM, the
// online softmax row by row (FlashAttention's rescaling, Dao et al. 2022, algorithm 1), the weighted
// values added by a second GEMM. Nothing of size queries x keys outlives a task: backward computes the
// probabilities again from the log-sum-exp, which is what lets a long sequence's attention fit.
//
// Every (sequence, head) is computed by one thread in a fixed order, so the result is the same bits at
// any thread count.
#include "common/kernels/cpu_attention_block.h"
#include "common/kernels/cpu_kernels.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "common/kernels/cpu_gemm.h"
#include "common/kernels/cpu_vector.h"
#include "common/kernels/math.h"
#include "common/kernels/parallel.h"

namespace course::cpu {
namespace {

constexpr std::int64_t kQueryBlock = 64;
constexpr float kMinusInfinity = -std::numeric_limits<float>::infinity();

thread_local std::vector<float> t_scores, t_grad_scores;

float scale_of(const AttentionBlockShape& s) { return 1.0f / std::sqrt(static_cast<float>(s.head_size)); }

// Whether query i may see key j.
bool visible(const AttentionBlockShape& s, const float* q_pos, const float* k_pos, std::int64_t i, std::int64_t j) {
  return !s.causal || k_pos[j] <= q_pos[i];
}

// Whether a block of queries [i0, i0 + rows) sees none of the keys (a causal block wholly above the
// diagonal, half of the ring's blocks): skipped.
bool hidden(const AttentionBlockShape& s, const float* q_pos, const float* k_pos, std::int64_t i0, std::int64_t rows) {
  if (!s.causal || s.keys == 0) return s.keys == 0;
  const float last_query = *std::max_element(q_pos + i0, q_pos + i0 + rows);
  const float first_key = *std::min_element(k_pos, k_pos + s.keys);
  return first_key > last_query;
}

}  // namespace

void attention_block(const float* q, const float* k, const float* v, const float* q_pos, const float* k_pos,
                     const AttentionBlockShape& s, float* row_max, float* row_sum, float* out) {
  const std::int64_t tq = s.queries, tk = s.keys, hs = s.head_size, c = s.heads * hs;
  const float scale = scale_of(s);
  parallel_for(static_cast<std::size_t>(s.batch * s.heads), static_cast<std::size_t>(2 * tq * tk * hs),
               [&](std::size_t first_task, std::size_t end_task) {
    for (auto bh = static_cast<std::int64_t>(first_task); bh < static_cast<std::int64_t>(end_task); ++bh) {
      const std::int64_t b = bh / s.heads, h = bh % s.heads;
      const float *qh = q + b * tq * c + h * hs, *kh = k + b * tk * c + h * hs, *vh = v + b * tk * c + h * hs;
      float* oh = out + b * tq * c + h * hs;
      for (std::int64_t i0 = 0; i0 < tq; i0 += kQueryBlock) {
        const std::int64_t rows = std::min(kQueryBlock, tq - i0);
        if (hidden(s, q_pos, k_pos, i0, rows)) continue;
        t_scores.resize(static_cast<std::size_t>(rows * tk));
        float* p = t_scores.data();
        sgemm(false, true, rows, tk, hs, scale, qh + i0 * c, c, kh, c, 0.0f, p, tk);  // q k^T
        for (std::int64_t r = 0; r < rows; ++r) {
          const std::int64_t i = i0 + r;
          float* row = p + r * tk;
          for (std::int64_t j = 0; j < tk; ++j)
            if (!visible(s, q_pos, k_pos, i, j)) row[j] = kMinusInfinity;
          float& m = row_max[bh * tq + i];
          float& l = row_sum[bh * tq + i];
          const float top = std::max(m, lane_max(row, static_cast<std::size_t>(tk)));
          if (top == kMinusInfinity) {  // no key of this block visible, none before: nothing to fold in
            std::fill(row, row + tk, 0.0f);
            continue;
          }
          // The running sums were taken against the old maximum: rescale them to the new one.
          const float correction = m == kMinusInfinity ? 0.0f : math::exp_f32(m - top);
          const double added = lane_sum(static_cast<std::size_t>(tk), [&](std::size_t j) {
            const float e = row[j] == kMinusInfinity ? 0.0f : math::exp_f32(row[j] - top);
            row[j] = e;
            return e;
          });
          l = l * correction + static_cast<float>(added);
          m = top;
          float* o = oh + i * c;
          for (std::int64_t d = 0; d < hs; ++d) o[d] *= correction;
        }
        sgemm(false, false, rows, hs, tk, 1.0f, p, tk, vh, c, 1.0f, oh + i0 * c, c);  // out += p v
      }
    }
  });
}

void attention_block_finish(const float* row_max, const float* row_sum, const AttentionBlockShape& s, float* out,
                            float* lse) {
  const std::int64_t tq = s.queries, hs = s.head_size, c = s.heads * hs;
  parallel_for(static_cast<std::size_t>(s.batch * s.heads), static_cast<std::size_t>(tq * hs),
               [&](std::size_t first_task, std::size_t end_task) {
    for (auto bh = static_cast<std::int64_t>(first_task); bh < static_cast<std::int64_t>(end_task); ++bh) {
      const std::int64_t b = bh / s.heads, h = bh % s.heads;
      for (std::int64_t i = 0; i < tq; ++i) {
        const float l = row_sum[bh * tq + i];
        float* o = out + b * tq * c + i * c + h * hs;
        // A row that saw no key (only possible without its own position among the keys) is 0, and
        // its lse +inf makes every probability backward computes for it 0.
        const float inverse = l > 0.0f ? 1.0f / l : 0.0f;
        for (std::int64_t d = 0; d < hs; ++d) o[d] *= inverse;
        lse[bh * tq + i] = l > 0.0f ? row_max[bh * tq + i] + std::log(l) : std::numeric_limits<float>::infinity();
      }
    }
  });
}

void attention_block_backward(const float* q, const float* k, const float* v, const float* q_pos, const float* k_pos,
                              const float* out, const float* lse, const float* grad_out, const AttentionBlockShape& s,
                              float* grad_q, float* grad_k, float* grad_v) {
  const std::int64_t tq = s.queries, tk = s.keys, hs = s.head_size, c = s.heads * hs;
  const float scale = scale_of(s);
  parallel_for(static_cast<std::size_t>(s.batch * s.heads), static_cast<std::size_t>(5 * tq * tk * hs),
               [&](std::size_t first_task, std::size_t end_task) {
    for (auto bh = static_cast<std::int64_t>(first_task); bh < static_cast<std::int64_t>(end_task); ++bh) {
      const std::int64_t b = bh / s.heads, h = bh % s.heads, at = b * tq * c + h * hs, kv_at = b * tk * c + h * hs;
      const float *qh = q + at, *kh = k + kv_at, *vh = v + kv_at, *oh = out + at, *gh = grad_out + at;
      float *dq = grad_q + at, *dk = grad_k + kv_at, *dv = grad_v + kv_at;
      for (std::int64_t i0 = 0; i0 < tq; i0 += kQueryBlock) {
        const std::int64_t rows = std::min(kQueryBlock, tq - i0);
        if (hidden(s, q_pos, k_pos, i0, rows)) continue;
        t_scores.resize(static_cast<std::size_t>(rows * tk));
        t_grad_scores.resize(static_cast<std::size_t>(rows * tk));
        float *p = t_scores.data(), *ds = t_grad_scores.data();
        sgemm(false, true, rows, tk, hs, scale, qh + i0 * c, c, kh, c, 0.0f, p, tk);          // q k^T
        sgemm(false, true, rows, tk, hs, 1.0f, gh + i0 * c, c, vh, c, 0.0f, ds, tk);          // dp = dy v^T
        for (std::int64_t r = 0; r < rows; ++r) {
          const std::int64_t i = i0 + r;
          float *prow = p + r * tk, *drow = ds + r * tk;
          const float* o = oh + i * c;
          const float* g = gh + i * c;
          const auto delta = static_cast<float>(lane_sum(static_cast<std::size_t>(hs), [&](std::size_t d) { return g[d] * o[d]; }));
          const float top = lse[bh * tq + i];
          for (std::int64_t j = 0; j < tk; ++j) {
            const float pj = visible(s, q_pos, k_pos, i, j) ? math::exp_f32(prow[j] - top) : 0.0f;
            prow[j] = pj;
            drow[j] = pj * (drow[j] - delta) * scale;
          }
        }
        sgemm(true, false, tk, hs, rows, 1.0f, p, tk, gh + i0 * c, c, 1.0f, dv, c);          // dv += p^T dy
        sgemm(false, false, rows, hs, tk, 1.0f, ds, tk, kh, c, 1.0f, dq + i0 * c, c);        // dq += ds k
        sgemm(true, false, tk, hs, rows, 1.0f, ds, tk, qh + i0 * c, c, 1.0f, dk, c);         // dk += ds^T q
      }
    }
  });
}

}  // namespace course::cpu

// The CPU backend's kernels of this family (cpu_kernels.h).
namespace course {
using namespace cpu_loops;

void CpuKernels::attention_block(const float* q, const float* k, const float* v, const float* q_pos, const float* k_pos,
                     const AttentionBlockShape& shape, float* row_max, float* row_sum, float* out) {
  cpu::attention_block(q, k, v, q_pos, k_pos, shape, row_max, row_sum, out);
}

void CpuKernels::attention_block_finish(const float* row_max, const float* row_sum, const AttentionBlockShape& shape, float* out,
                            float* lse) {
  cpu::attention_block_finish(row_max, row_sum, shape, out, lse);
}

void CpuKernels::attention_block_backward(const float* q, const float* k, const float* v, const float* q_pos, const float* k_pos,
                              const float* out, const float* lse, const float* grad_out, const AttentionBlockShape& shape,
                              float* grad_q, float* grad_k, float* grad_v) {
  cpu::attention_block_backward(q, k, v, q_pos, k_pos, out, lse, grad_out, shape, grad_q, grad_k, grad_v);
}

}  // namespace course
