// CPU kernels: the reference implementation of every op. GEMM goes to OpenBLAS.
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "common/kernels/kernels.h"
#include "common/kernels/half.h"
#include "common/kernels/math.h"

namespace course {
namespace {

class CpuKernels final : public Kernels {
 public:
  void fill(float* out, std::size_t n, float value) override { std::fill(out, out + n, value); }
  void copy(float* out, const float* in, std::size_t n) override { std::copy(in, in + n, out); }

  void gemm(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const float* a,
            const float* b, float beta, float* c) override {
    if (m == 0 || n == 0) return;
    if (k == 0) {  // BLAS leaves C untouched for k == 0 only when beta == 1
      for (std::int64_t i = 0; i < m * n; ++i) c[i] = beta == 0.0f ? 0.0f : beta * c[i];
      return;
    }
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n, k, alpha, a,
                ta ? m : k, b, tb ? k : n, beta, c, n);
  }

  void binary(BinaryOp op, const float* a, std::size_t an, const float* b, std::size_t bn, float* out,
              std::size_t n) override {
    if (an == n && bn == n) {  // the common case, kept free of modulo so it vectorises
      switch (op) {
        case BinaryOp::add: for (std::size_t i = 0; i < n; ++i) out[i] = a[i] + b[i]; break;
        case BinaryOp::sub: for (std::size_t i = 0; i < n; ++i) out[i] = a[i] - b[i]; break;
        case BinaryOp::mul: for (std::size_t i = 0; i < n; ++i) out[i] = a[i] * b[i]; break;
        case BinaryOp::max: for (std::size_t i = 0; i < n; ++i) out[i] = std::max(a[i], b[i]); break;
      }
      return;
    }
    for (std::size_t i = 0; i < n; ++i) {
      float x = a[i % an], y = b[i % bn];
      out[i] = op == BinaryOp::add ? x + y : op == BinaryOp::sub ? x - y : op == BinaryOp::mul ? x * y : std::max(x, y);
    }
  }

  void to_half(HalfFormat format, const float* in, std::uint16_t* out, std::size_t n) override {
    for (std::size_t i = 0; i < n; ++i)
      out[i] = format == HalfFormat::float16 ? half::to_float16(in[i]) : half::to_bfloat16(in[i]);
  }
  void from_half(HalfFormat format, const std::uint16_t* in, float* out, std::size_t n) override {
    for (std::size_t i = 0; i < n; ++i)
      out[i] = format == HalfFormat::float16 ? half::from_float16(in[i]) : half::from_bfloat16(in[i]);
  }
  void scale(const float* in, float factor, float* out, std::size_t n) override {
    for (std::size_t i = 0; i < n; ++i) out[i] = in[i] * factor;
  }

  void sum(const float* in, std::size_t n, float* out) override {
    double total = 0.0;  // double accumulation: the reference should not lose bits to summation order
    for (std::size_t i = 0; i < n; ++i) total += in[i];
    *out = static_cast<float>(total);
  }

  void sum_rows(const float* in, std::size_t rows, std::size_t cols, float* out) override {
    for (std::size_t j = 0; j < cols; ++j) {
      double total = 0.0;
      for (std::size_t i = 0; i < rows; ++i) total += in[i * cols + j];
      out[j] = static_cast<float>(total);
    }
  }

  void unary(UnaryOp op, const float* in, float* out, std::size_t n) override {
    if (op == UnaryOp::relu)
      for (std::size_t i = 0; i < n; ++i) out[i] = in[i] > 0.0f ? in[i] : 0.0f;
    else
      for (std::size_t i = 0; i < n; ++i) out[i] = math::gelu(in[i]);
  }

  void unary_backward(UnaryOp op, const float* in, const float* g, float* out, std::size_t n) override {
    if (op == UnaryOp::relu)
      for (std::size_t i = 0; i < n; ++i) out[i] = in[i] > 0.0f ? g[i] : 0.0f;
    else
      for (std::size_t i = 0; i < n; ++i) out[i] = g[i] * math::gelu_grad(in[i]);
  }

  void cross_entropy(const float* logits, const float* targets, std::size_t rows, std::size_t cols,
                     float* losses) override {
    for (std::size_t r = 0; r < rows; ++r) {
      const float* row = logits + r * cols;
      float top = *std::max_element(row, row + cols);  // subtract the max so exp cannot overflow
      double total = 0.0;
      for (std::size_t c = 0; c < cols; ++c) total += std::exp(static_cast<double>(row[c] - top));
      auto target = static_cast<std::size_t>(targets[r]);
      losses[r] = static_cast<float>(std::log(total) + top - row[target]);
    }
  }

  void cross_entropy_backward(const float* logits, const float* targets, const float* g, std::size_t rows,
                              std::size_t cols, float* out) override {
    for (std::size_t r = 0; r < rows; ++r) {
      const float* row = logits + r * cols;
      float top = *std::max_element(row, row + cols);
      double total = 0.0;
      for (std::size_t c = 0; c < cols; ++c) total += std::exp(static_cast<double>(row[c] - top));
      auto target = static_cast<std::size_t>(targets[r]);
      for (std::size_t c = 0; c < cols; ++c) {
        double softmax = std::exp(static_cast<double>(row[c] - top)) / total;
        out[r * cols + c] = static_cast<float>((softmax - (c == target ? 1.0 : 0.0)) * g[r]);
      }
    }
  }

  void sgd_step(float* p, const float* g, float* buf, std::size_t n, const SgdParams& s) override {
    float none = 0.0f;  // without momentum there is no buffer: buf = 0 * buf + g
    for (std::size_t i = 0; i < n; ++i)
      p[i] = math::sgd_update(p[i], g[i], buf ? buf[i] : (none = 0.0f), s.lr, s.momentum, s.weight_decay);
  }

  void adam_step(float* p, const float* g, float* m, float* v, std::size_t n, const AdamParams& a) override {
    for (std::size_t i = 0; i < n; ++i)
      p[i] = math::adam_update(p[i], g[i], m[i], v[i], a.lr, a.beta1, a.beta2, a.eps, a.weight_decay,
                               a.decoupled_weight_decay, a.bias_correction1, a.bias_correction2);
  }
};

}  // namespace

Kernels& cpu_kernels() {
  static CpuKernels instance;
  return instance;
}

#if COURSE_HAVE_CUDA
Kernels& cuda_kernels();  // cuda_kernels.cu
#endif

Kernels& kernels(Device device) {
  if (device == Device::cpu) return cpu_kernels();
#if COURSE_HAVE_CUDA
  return cuda_kernels();
#else
  throw std::runtime_error("a CUDA kernel was requested in a build without the CUDA backend");
#endif
}

void set_cpu_gemm_threads(int threads) { openblas_set_num_threads(std::max(1, threads)); }

}  // namespace course
