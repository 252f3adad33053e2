// Ring attention's blocks on the GPU (context parallelism): one query block against one key-value block,
// its running max and sum kept for the online softmax, and their gradients.

#include "common/kernels/cuda_kernels.h"

namespace course {
using namespace cuda_launch;
namespace {

// Ring attention's blocks (kernels.h, AttentionBlockShape): one thread per (sequence, head, row), the
// scores computed on the fly. Plain and slow beside a tiled FlashAttention kernel, but each row's sums
// run in the CPU reference's order of keys, and nothing of size queries x keys is ever stored.
__device__ inline float block_score(const float* q, const float* k, std::int64_t hs, float scale) {
  float s = 0.0f;
  for (std::int64_t d = 0; d < hs; ++d) s += q[d] * k[d];
  return s * scale;
}

__global__ void attention_block_kernel(const float* q, const float* k, const float* v, const float* q_pos,
                                       const float* k_pos, AttentionBlockShape s, float* row_max, float* row_sum,
                                       float* out) {
  const std::int64_t tq = s.queries, tk = s.keys, hs = s.head_size, c = s.heads * hs, rows = s.batch * s.heads * tq;
  const float scale = rsqrtf(static_cast<float>(hs));
  for (std::int64_t r = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; r < rows;
       r += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t bh = r / tq, i = r % tq, b = bh / s.heads, h = bh % s.heads;
    const float* qi = q + b * tq * c + i * c + h * hs;
    float* o = out + b * tq * c + i * c + h * hs;
    float top = row_max[r];
    for (std::int64_t j = 0; j < tk; ++j)
      if (!s.causal || k_pos[j] <= q_pos[i]) top = fmaxf(top, block_score(qi, k + b * tk * c + j * c + h * hs, hs, scale));
    if (top == -INFINITY) continue;
    const float correction = row_max[r] == -INFINITY ? 0.0f : math::exp_f32(row_max[r] - top);
    float l = row_sum[r] * correction;
    for (std::int64_t d = 0; d < hs; ++d) o[d] *= correction;
    for (std::int64_t j = 0; j < tk; ++j) {
      if (s.causal && k_pos[j] > q_pos[i]) continue;
      const float p = math::exp_f32(block_score(qi, k + b * tk * c + j * c + h * hs, hs, scale) - top);
      l += p;
      const float* vj = v + b * tk * c + j * c + h * hs;
      for (std::int64_t d = 0; d < hs; ++d) o[d] += p * vj[d];
    }
    row_max[r] = top;
    row_sum[r] = l;
  }
}

__global__ void attention_block_finish_kernel(const float* row_max, const float* row_sum, AttentionBlockShape s,
                                              float* out, float* lse) {
  const std::int64_t tq = s.queries, hs = s.head_size, c = s.heads * hs, rows = s.batch * s.heads * tq;
  for (std::int64_t r = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; r < rows;
       r += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t bh = r / tq, i = r % tq, b = bh / s.heads, h = bh % s.heads;
    const float l = row_sum[r], inverse = l > 0.0f ? 1.0f / l : 0.0f;
    float* o = out + b * tq * c + i * c + h * hs;
    for (std::int64_t d = 0; d < hs; ++d) o[d] *= inverse;
    lse[r] = l > 0.0f ? row_max[r] + logf(l) : INFINITY;
  }
}

// dq, one thread per query row.
__global__ void attention_block_grad_q_kernel(const float* q, const float* k, const float* v, const float* q_pos,
                                              const float* k_pos, const float* out, const float* lse,
                                              const float* grad_out, AttentionBlockShape s, float* grad_q) {
  const std::int64_t tq = s.queries, tk = s.keys, hs = s.head_size, c = s.heads * hs, rows = s.batch * s.heads * tq;
  const float scale = rsqrtf(static_cast<float>(hs));
  for (std::int64_t r = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; r < rows;
       r += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t bh = r / tq, i = r % tq, b = bh / s.heads, h = bh % s.heads, at = b * tq * c + i * c + h * hs;
    float delta = 0.0f;
    for (std::int64_t d = 0; d < hs; ++d) delta += grad_out[at + d] * out[at + d];
    for (std::int64_t j = 0; j < tk; ++j) {
      if (s.causal && k_pos[j] > q_pos[i]) continue;
      const std::int64_t kv = b * tk * c + j * c + h * hs;
      const float p = math::exp_f32(block_score(q + at, k + kv, hs, scale) - lse[r]);
      const float ds = p * (block_score(grad_out + at, v + kv, hs, 1.0f) - delta) * scale;
      for (std::int64_t d = 0; d < hs; ++d) grad_q[at + d] += ds * k[kv + d];
    }
  }
}

// dk and dv, one thread per key row.
__global__ void attention_block_grad_kv_kernel(const float* q, const float* k, const float* v, const float* q_pos,
                                               const float* k_pos, const float* out, const float* lse,
                                               const float* grad_out, AttentionBlockShape s, float* grad_k,
                                               float* grad_v) {
  const std::int64_t tq = s.queries, tk = s.keys, hs = s.head_size, c = s.heads * hs, rows = s.batch * s.heads * tk;
  const float scale = rsqrtf(static_cast<float>(hs));
  for (std::int64_t r = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; r < rows;
       r += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t bh = r / tk, j = r % tk, b = bh / s.heads, h = bh % s.heads, kv = b * tk * c + j * c + h * hs;
    for (std::int64_t i = 0; i < tq; ++i) {
      if (s.causal && k_pos[j] > q_pos[i]) continue;
      const std::int64_t at = b * tq * c + i * c + h * hs;
      float delta = 0.0f;
      for (std::int64_t d = 0; d < hs; ++d) delta += grad_out[at + d] * out[at + d];
      const float p = math::exp_f32(block_score(q + at, k + kv, hs, scale) - lse[bh * tq + i]);
      const float ds = p * (block_score(grad_out + at, v + kv, hs, 1.0f) - delta) * scale;
      for (std::int64_t d = 0; d < hs; ++d) {
        grad_v[kv + d] += p * grad_out[at + d];
        grad_k[kv + d] += ds * q[at + d];
      }
    }
  }
}

}  // namespace

void CudaKernels::attention_block(const float* q, const float* k, const float* v, const float* q_pos, const float* k_pos,
                     const AttentionBlockShape& s, float* row_max, float* row_sum, float* out) {
  const auto rows = static_cast<std::size_t>(s.batch * s.heads * s.queries);
  if (!rows || !s.keys) return;
  attention_block_kernel<<<blocks_for(rows), kThreads>>>(q, k, v, q_pos, k_pos, s, row_max, row_sum, out);
  check_launch();
}

void CudaKernels::attention_block_finish(const float* row_max, const float* row_sum, const AttentionBlockShape& s, float* out,
                            float* lse) {
  const auto rows = static_cast<std::size_t>(s.batch * s.heads * s.queries);
  if (!rows) return;
  attention_block_finish_kernel<<<blocks_for(rows), kThreads>>>(row_max, row_sum, s, out, lse);
  check_launch();
}

void CudaKernels::attention_block_backward(const float* q, const float* k, const float* v, const float* q_pos, const float* k_pos,
                              const float* out, const float* lse, const float* grad_out, const AttentionBlockShape& s,
                              float* grad_q, float* grad_k, float* grad_v) {
  const auto queries = static_cast<std::size_t>(s.batch * s.heads * s.queries), keys = static_cast<std::size_t>(s.batch * s.heads * s.keys);
  if (!queries || !keys) return;
  attention_block_grad_q_kernel<<<blocks_for(queries), kThreads>>>(q, k, v, q_pos, k_pos, out, lse, grad_out, s, grad_q);
  check_launch();
  attention_block_grad_kv_kernel<<<blocks_for(keys), kThreads>>>(q, k, v, q_pos, k_pos, out, lse, grad_out, s, grad_k,
                                                                 grad_v);
  check_launch();
}

}  // namespace course
