// Attention on the GPU: the math kernel from the library's own pieces (the heads gathered apart, cuBLAS's
// strided-batched GEMMs, the softmax rows in lanes), and FlashAttention's entry points (cuda_flash_attention.cu).
#include "common/kernels/cuda_flash_attention.h"

#include <cmath>

#include "common/kernels/cuda_kernels.h"
#include "common/kernels/rows.h"

namespace course {
using namespace cuda_launch;
namespace {

// Attention's probabilities in lanes (rows.h), over [batch x heads x tokens, tokens] scores: row r is
// query r % tokens, which sees every key, or with the causal mask keys 0 to itself. The CPU's formula.
__global__ void attention_softmax_kernel(float* scores, std::size_t rows, std::size_t tokens, bool causal) {
  for_each_row_in_lanes(rows, [&](const GroupLanes& lanes, std::size_t r) {
    math::attention_softmax_row(lanes, scores + r * tokens, causal ? r % tokens + 1 : tokens, tokens);
  });
}

__global__ void attention_softmax_backward_kernel(const float* p, float* dp, std::size_t rows, std::size_t tokens,
                                                  bool causal, float scale) {
  for_each_row_in_lanes(rows, [&](const GroupLanes& lanes, std::size_t r) {
    math::attention_softmax_backward_row(lanes, p + r * tokens, dp + r * tokens, causal ? r % tokens + 1 : tokens,
                                         tokens, scale);
  });
}

}  // namespace

float* CudaKernels::apply_dropout_mask(const float* p, const AttentionShape& s, float* out) {
  const auto n = static_cast<std::size_t>(s.batch * s.heads * s.tokens * s.tokens);
  const auto first = static_cast<std::uint64_t>(s.first_sequence * s.heads * s.tokens * s.tokens);  // a slice's place
  dropout(p, out, n, s.dropout, s.seed, first);
  return out;
}

// Attention from the library's own pieces: the heads gathered apart, cuBLAS's strided-batched GEMMs over
// every (sequence, head), the CPU's softmax rows in lanes, the output gathered back into [B, T, C].
void CudaKernels::attention(const float* qkv, const AttentionShape& s, float* probs, float* y) {
  const std::int64_t bh = s.batch * s.heads, t = s.tokens, hs = s.head_size, n = bh * t * hs;
  if (!n) return;
  DeviceBuffer heads(static_cast<std::size_t>(3 * n)), out(static_cast<std::size_t>(n));
  const float *q = heads.get(), *k = q + n, *v = q + 2 * n;
  gather(qkv, heads.get(), packed_to_heads(s));
  gemm_batched(false, true, bh, t, t, hs, 1.0f / std::sqrt(static_cast<float>(hs)), q, t * hs, k, t * hs, 0.0f,
               probs, t * t);
  const auto rows = static_cast<std::size_t>(bh * t);
  attention_softmax_kernel<<<blocks_for(rows * math::kLanes), kThreads>>>(probs, rows, static_cast<std::size_t>(t), s.causal);
  check_launch();
  DeviceBuffer dropped(s.dropout > 0.0f ? static_cast<std::size_t>(bh * t * t) : 0);
  const float* weights = s.dropout > 0.0f ? apply_dropout_mask(probs, s, dropped.get()) : probs;
  gemm_batched(false, false, bh, t, hs, t, 1.0f, weights, t * t, v, t * hs, 0.0f, out.get(), t * hs);
  gather(out.get(), y, heads_to_tokens(s));
}

void CudaKernels::attention_backward(const float* qkv, const float* probs, const float* grad_y, const AttentionShape& s,
                        float* grad_qkv) {
  const std::int64_t bh = s.batch * s.heads, t = s.tokens, hs = s.head_size, n = bh * t * hs;
  if (!n) return;
  DeviceBuffer heads(static_cast<std::size_t>(3 * n)), dy(static_cast<std::size_t>(n));
  DeviceBuffer grads(static_cast<std::size_t>(3 * n)), dp(static_cast<std::size_t>(bh * t * t));
  const float *q = heads.get(), *k = q + n, *v = q + 2 * n;
  float *dq = grads.get(), *dk = dq + n, *dv = dq + 2 * n;
  gather(qkv, heads.get(), packed_to_heads(s));
  gather(grad_y, dy.get(), tokens_to_heads(s));
  DeviceBuffer dropped(s.dropout > 0.0f ? static_cast<std::size_t>(bh * t * t) : 0);
  const float* weights = s.dropout > 0.0f ? apply_dropout_mask(probs, s, dropped.get()) : probs;
  gemm_batched(true, false, bh, t, hs, t, 1.0f, weights, t * t, dy.get(), t * hs, 0.0f, dv, t * hs);  // p^T dy
  gemm_batched(false, true, bh, t, t, hs, 1.0f, dy.get(), t * hs, v, t * hs, 0.0f, dp.get(), t * t);  // dy v^T
  if (s.dropout > 0.0f) apply_dropout_mask(dp.get(), s, dp.get());
  const auto rows = static_cast<std::size_t>(bh * t);  // ds, the scale 1/sqrt(hs) inside, as on the CPU
  attention_softmax_backward_kernel<<<blocks_for(rows * math::kLanes), kThreads>>>(
      probs, dp.get(), rows, static_cast<std::size_t>(t), s.causal, 1.0f / std::sqrt(static_cast<float>(hs)));
  check_launch();
  gemm_batched(false, false, bh, t, hs, t, 1.0f, dp.get(), t * t, k, t * hs, 0.0f, dq, t * hs);  // ds k
  gemm_batched(true, false, bh, t, hs, t, 1.0f, dp.get(), t * t, q, t * hs, 0.0f, dk, t * hs);   // ds^T q
  gather(grads.get(), grad_qkv, heads_to_packed(s));
}

void CudaKernels::flash_attention(const float* qkv, const AttentionShape& s, float* lse, float* y) {
  cuda_flash::forward(qkv, s, lse, y);
}

void CudaKernels::flash_attention_backward(const float* qkv, const float* y, const float* lse, const float* grad_y,
                              const AttentionShape& s, float* grad_qkv) {
  DeviceBuffer delta(static_cast<std::size_t>(s.batch * s.heads * s.tokens));
  cuda_flash::backward(qkv, y, lse, grad_y, s, delta.get(), grad_qkv);
}

void CudaKernels::flash_attention_half(HalfFormat format, const std::uint16_t* qkv, const AttentionShape& s, float* lse,
                          std::uint16_t* y) {
  cuda_flash::forward_half(format, qkv, s, lse, y);
}

void CudaKernels::flash_attention_backward_half(HalfFormat format, const std::uint16_t* qkv, const std::uint16_t* y,
                                   const float* lse, const std::uint16_t* grad_y, const AttentionShape& s,
                                   std::uint16_t* grad_qkv) {
  DeviceBuffer delta(static_cast<std::size_t>(s.batch * s.heads * s.tokens));
  cuda_flash::backward_half(format, qkv, y, lse, grad_y, s, delta.get(), grad_qkv);
}

}  // namespace course
