// The CPU kernels with every 16-bit kernel replaced by its definition (EmulatedHalfKernels, kernels.h):
// widened operands, the float32 kernel, the result rounded once. Written apart from the 16-bit kernels
// (cpu_elementwise.cpp, cpu_gemm.cpp, cpu_flash_attention.cpp, cpu_cross_entropy.cpp), so that a bug in
// one of them is not repeated here.
#include <algorithm>
#include <vector>

#include "common/kernels/cpu_kernels.h"

namespace course {
namespace {

thread_local bool emulating = false;

std::vector<float> widened(CpuKernels& k, HalfFormat format, const std::uint16_t* in, std::size_t n) {
  std::vector<float> out(n);
  if (n) k.from_half(format, in, out.data(), n);
  return out;
}

// The values a strided batch of matrices spans: the last one's start, plus one matrix.
std::size_t spanned(std::int64_t batch, std::int64_t stride, std::int64_t size) {
  return batch > 0 ? static_cast<std::size_t>((batch - 1) * stride + size) : 0;
}

class CpuKernelsWithoutHalf final : public CpuKernels {
 public:
  void gemm_batched_half(HalfFormat f, bool ta, bool tb, std::int64_t batch, std::int64_t m, std::int64_t n,
                         std::int64_t k, float alpha, const std::uint16_t* a, std::int64_t sa, const std::uint16_t* b,
                         std::int64_t sb, float beta, std::uint16_t* c, std::int64_t sc) override {
    const auto wa = widened(*this, f, a, spanned(batch, sa, m * k)), wb = widened(*this, f, b, spanned(batch, sb, k * n));
    const std::size_t cn = spanned(batch, sc, m * n);
    std::vector<float> wc = beta != 0.0f ? widened(*this, f, c, cn) : std::vector<float>(cn, 0.0f);
    gemm_batched(ta, tb, batch, m, n, k, alpha, wa.data(), sa, wb.data(), sb, beta, wc.data(), sc);
    rounded(f, wc, c);
  }
  void binary_half(HalfFormat f, BinaryOp op, const std::uint16_t* a, std::size_t an, const std::uint16_t* b,
                   std::size_t bn, std::uint16_t* out, std::size_t n) override {
    const auto wa = widened(*this, f, a, an), wb = widened(*this, f, b, bn);
    std::vector<float> r(n);
    binary(op, wa.data(), an, wb.data(), bn, r.data(), n);
    rounded(f, r, out);
  }
  void unary_half(HalfFormat f, UnaryOp op, const std::uint16_t* in, std::uint16_t* out, std::size_t n) override {
    const auto w = widened(*this, f, in, n);
    std::vector<float> r(n);
    unary(op, w.data(), r.data(), n);
    rounded(f, r, out);
  }
  void unary_backward_half(HalfFormat f, UnaryOp op, const std::uint16_t* in, const std::uint16_t* g,
                           std::uint16_t* out, std::size_t n) override {
    const auto w = widened(*this, f, in, n), wg = widened(*this, f, g, n);
    std::vector<float> r(n);
    unary_backward(op, w.data(), wg.data(), r.data(), n);
    rounded(f, r, out);
  }
  void add_half(HalfFormat f, const std::uint16_t* in, float* acc, std::size_t n) override {
    const auto w = widened(*this, f, in, n);
    binary(BinaryOp::add, acc, n, w.data(), n, acc, n);
  }
  void flash_attention_half(HalfFormat f, const std::uint16_t* qkv, const AttentionShape& s, float* lse,
                            std::uint16_t* y) override {
    const auto wq = widened(*this, f, qkv, qkv_values(s));
    std::vector<float> wy(output_values(s));
    flash_attention(wq.data(), s, lse, wy.data());
    rounded(f, wy, y);
  }
  void flash_attention_backward_half(HalfFormat f, const std::uint16_t* qkv, const std::uint16_t* y, const float* lse,
                                     const std::uint16_t* grad_y, const AttentionShape& s,
                                     std::uint16_t* grad_qkv) override {
    const auto wq = widened(*this, f, qkv, qkv_values(s)), wy = widened(*this, f, y, output_values(s)),
               wg = widened(*this, f, grad_y, output_values(s));
    std::vector<float> r(qkv_values(s));
    flash_attention_backward(wq.data(), wy.data(), lse, wg.data(), s, r.data());
    rounded(f, r, grad_qkv);
  }
  // The float32 cross-entropy keeps nothing for backward: `top` and `total` are left at zero, and the
  // backward below computes from the logits alone.
  void cross_entropy_half(HalfFormat f, const std::uint16_t* logits, const float* targets, std::size_t rows,
                          std::size_t cols, float* losses, float* top, double* total) override {
    const auto w = widened(*this, f, logits, rows * cols);
    cross_entropy(w.data(), targets, rows, cols, losses);
    std::fill(top, top + rows, 0.0f);
    std::fill(total, total + rows, 0.0);
  }
  void cross_entropy_backward_half(HalfFormat f, const std::uint16_t* logits, const float* targets, const float* g,
                                   const float*, const double*, std::size_t rows, std::size_t cols,
                                   std::uint16_t* out) override {
    const auto w = widened(*this, f, logits, rows * cols);
    std::vector<float> r(rows * cols);
    cross_entropy_backward(w.data(), targets, g, rows, cols, r.data());
    rounded(f, r, out);
  }

 private:
  void rounded(HalfFormat f, const std::vector<float>& values, std::uint16_t* out) {
    if (!values.empty()) to_half(f, values.data(), out, values.size());
  }
  // qkv [batch, tokens, 3 x heads x head size] and y [batch, tokens, heads x head size] (kernels.h).
  static std::size_t output_values(const AttentionShape& s) {
    return static_cast<std::size_t>(s.batch * s.tokens * s.heads * s.head_size);
  }
  static std::size_t qkv_values(const AttentionShape& s) { return 3 * output_values(s); }
};

}  // namespace

EmulatedHalfKernels::EmulatedHalfKernels() : previous_(emulating) { emulating = true; }
EmulatedHalfKernels::~EmulatedHalfKernels() { emulating = previous_; }
bool EmulatedHalfKernels::active() { return emulating; }

Kernels& cpu_kernels_without_half() {
  static CpuKernelsWithoutHalf instance;
  return instance;
}

}  // namespace course
