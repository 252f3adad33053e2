// The op kernels, declared once. cpu_kernels.cpp is the reference; cuda_kernels.cu implements the
// same interface for the GPU, and tests/kernel_parity_test.cpp checks one against the other.
// Kernels take raw pointers and sizes; shapes, broadcasting rules and autograd live in common/ops.
#pragma once
#include <cstddef>
#include <cstdint>

#include "common/core/device.h"

namespace course {

enum class BinaryOp { add, sub, mul, max };
enum class UnaryOp { relu, gelu };
enum class HalfFormat { float16, bfloat16 };  // 16-bit storage (common/kernels/half.h)

struct SgdParams {
  float lr, momentum, weight_decay;
};
struct AdamParams {
  float lr, beta1, beta2, eps, weight_decay;
  bool decoupled_weight_decay;       // AdamW (Loshchilov & Hutter, 2019) when true
  float bias_correction1, bias_correction2;  // 1 - beta^t, computed by the optimizer
};

class Kernels {
 public:
  virtual ~Kernels() = default;
  virtual void fill(float* out, std::size_t n, float value) = 0;
  virtual void copy(float* out, const float* in, std::size_t n) = 0;
  // Row-major C[m,n] = alpha * op(A) op(B) + beta * C, with op(X) = X or X^T.
  virtual void gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
                    const float* a, const float* b, float beta, float* c) = 0;
  // out[i] = a[i % a_n] op b[i % b_n] for i < n: same shapes, or one operand repeated (broadcast).
  virtual void binary(BinaryOp op, const float* a, std::size_t a_n, const float* b, std::size_t b_n, float* out,
                      std::size_t n) = 0;
  virtual void scale(const float* in, float factor, float* out, std::size_t n) = 0;
  // float32 to 16 bits (round to nearest even) and back; chapter 05's compression hooks.
  virtual void to_half(HalfFormat format, const float* in, std::uint16_t* out, std::size_t n) = 0;
  virtual void from_half(HalfFormat format, const std::uint16_t* in, float* out, std::size_t n) = 0;
  // Deterministic reductions: a fixed summation order, so repeated runs give identical bits.
  virtual void sum(const float* in, std::size_t n, float* out) = 0;
  virtual void sum_rows(const float* in, std::size_t rows, std::size_t cols, float* out) = 0;  // over rows
  virtual void unary(UnaryOp op, const float* in, float* out, std::size_t n) = 0;
  virtual void unary_backward(UnaryOp op, const float* in, const float* grad_out, float* grad_in,
                              std::size_t n) = 0;
  // Per-row softmax cross-entropy; targets hold class indices as floats.
  virtual void cross_entropy(const float* logits, const float* targets, std::size_t rows, std::size_t cols,
                             float* losses) = 0;
  virtual void cross_entropy_backward(const float* logits, const float* targets, const float* grad_losses,
                                      std::size_t rows, std::size_t cols, float* grad_logits) = 0;
  // momentum_buffer may be null when momentum is 0.
  virtual void sgd_step(float* param, const float* grad, float* momentum_buffer, std::size_t n,
                        const SgdParams& p) = 0;
  virtual void adam_step(float* param, const float* grad, float* m, float* v, std::size_t n,
                         const AdamParams& p) = 0;
};

Kernels& kernels(Device device);
// Limits the CPU GEMM to `threads` threads (OpenBLAS); ranks sharing a machine must not oversubscribe it.
void set_cpu_gemm_threads(int threads);

}  // namespace course
