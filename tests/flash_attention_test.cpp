// FlashAttention-2's CPU model (kernels/cpu_flash_attention.cpp, the GPU kernels' tiles and order) against
// attention computed in double, each output within the bound its roundings allow (derived below, element
// by element); a slice of the batch against the whole, bit for bit; and the op's two backends
// (ops/sdpa_kernel.h) against each other. kernel_parity_test holds the CUDA kernels to this model's bits.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "common/kernels/flash.h"
#include "common/kernels/kernels.h"
#include "common/ops/ops.h"
#include "common/ops/sdpa_kernel.h"
#include "common/verify/compare.h"

namespace course::testing {
namespace {

constexpr double u = verify::kUnitRoundoff;
double gamma(std::int64_t n) { return verify::gamma(n); }

// The bound on each of exp_f32's results (math.h: within 2 ulp, an ulp at most 2u of the value).
constexpr double kExpError = 4 * u;

struct Case {
  std::int64_t batch, tokens, heads, head_size;
  bool causal;
  float dropout;
  std::string name() const {
    return std::to_string(batch) + "x" + std::to_string(tokens) + " tokens, " + std::to_string(heads) + " heads of " +
           std::to_string(head_size) + (causal ? ", causal" : ", full") + (dropout > 0 ? ", dropout" : "");
  }
};

// Shapes below, at and past the tiles (32 keys, 64 rows), head sizes that fill D and that do not.
const std::vector<Case> kCases = {
    {1, 1, 1, 16, true, 0.0f},   {2, 5, 3, 8, true, 0.0f},    {1, 33, 2, 24, true, 0.0f},
    {1, 64, 1, 64, false, 0.0f}, {2, 65, 2, 32, true, 0.2f},  {1, 130, 1, 128, true, 0.0f},
    {1, 257, 2, 16, true, 0.0f}, {1, 100, 1, 40, false, 0.1f}};

std::vector<float> normal(std::size_t n, unsigned seed, float sigma) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, sigma);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

struct Outputs {
  std::vector<float> y, lse, grad;
};

Outputs run_flash(const std::vector<float>& qkv, const std::vector<float>& dy, const AttentionShape& s) {
  Outputs out;
  out.y.resize(dy.size()), out.lse.resize(static_cast<std::size_t>(s.batch * s.heads * s.tokens)), out.grad.resize(qkv.size());
  Kernels& k = kernels(Device::cpu);
  k.flash_attention(qkv.data(), s, out.lse.data(), out.y.data());
  k.flash_attention_backward(qkv.data(), out.y.data(), out.lse.data(), dy.data(), s, out.grad.data());
  return out;
}

// Attention in double, with the first-order bound on each of the model's float32 results. The model's
// roundings, by quantity (u = 2^-24, gamma(n) = n u / (1 - n u), Higham 2002, section 3.1):
// - a score s = (q . k) scale: a dot product of hs terms in order, gamma(hs) sum |q_d k_d| scale, plus the
//   scale's own two roundings and the product's, 3u |s|: e_s;
// - a weight exp(s - m) as it reaches y: the scores' error twice (its own, and the maximum's), the
//   subtraction's u |s - m|, exp_f32's, and per tile a correction exp(m_old - m_new) with its subtraction
//   and product (5u + u |m_old - m_new|, the steps of the maximum adding to at most the scores' range),
//   and the dropout factor's three roundings: eps_w = 2 max e_s + (5 tiles + 9) u + 2 u range + kExpError;
// - y = N / L with both sums' terms off by eps_w and each sum's gamma(T) roundings:
//   |dy| <= 2 (eps_w + gamma(T)) sum_j w_ij |v_j| + u |y|;
// - lse = m + log L: max e_s + eps_w + gamma(T) + 2u |lse|;
// backward, from the model's own lse (within the bound above):
// - p = exp(s - lse): eps_p = e_s + e_lse + u |s - lse| + kExpError, relative;
// - dp = keep (dy . v): keep gamma(hs) sum |dy v| + 2u |dp|; delta = dy . y: gamma(hs) sum |dy y| + sum |dy| e_y;
// - ds = p (dp - delta) scale: scale p (eps_p |dp - delta| + e_dp + e_delta) + 4u |ds|;
// - dq = sum_j ds k_j, dk = sum_i ds q_i: sum e_ds |k| + gamma(T + 1) sum |ds k|; dv = sum_i p keep dy_i:
//   sum (eps_p + 3u) p keep |dy| + gamma(T + 1) sum p keep |dy|.
struct Reference {
  Outputs value;
  std::vector<double> y, lse, grad, y_bound, lse_bound, grad_bound;
};

Reference reference(const std::vector<float>& qkv, const std::vector<float>& dy, const AttentionShape& s) {
  const std::int64_t t = s.tokens, hs = s.head_size, c = s.heads * hs, ld = 3 * c;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hs));
  Reference r;
  r.y.assign(dy.size(), 0), r.y_bound.assign(dy.size(), 0), r.grad.assign(qkv.size(), 0), r.grad_bound.assign(qkv.size(), 0);
  r.lse.assign(static_cast<std::size_t>(s.batch * s.heads * t), 0), r.lse_bound = r.lse;
  for (std::int64_t b = 0; b < s.batch; ++b)
    for (std::int64_t h = 0; h < s.heads; ++h) {
      const std::int64_t bh = b * s.heads + h;
      math::FlashDropout drop;
      drop.p = s.dropout, drop.seed = s.seed, drop.tokens = t;
      drop.base = static_cast<std::uint64_t>(((s.first_sequence + b) * s.heads + h) * t * t);
      auto q = [&](std::int64_t i, std::int64_t d) { return static_cast<double>(qkv[(b * t + i) * ld + h * hs + d]); };
      auto k = [&](std::int64_t j, std::int64_t d) { return static_cast<double>(qkv[(b * t + j) * ld + c + h * hs + d]); };
      auto v = [&](std::int64_t j, std::int64_t d) { return static_cast<double>(qkv[(b * t + j) * ld + 2 * c + h * hs + d]); };
      auto g = [&](std::int64_t i, std::int64_t d) { return static_cast<double>(dy[(b * t + i) * c + h * hs + d]); };
      auto y_at = [&](std::int64_t i, std::int64_t d) { return static_cast<std::size_t>((b * t + i) * c + h * hs + d); };
      auto grad_at = [&](int part, std::int64_t i, std::int64_t d) {
        return static_cast<std::size_t>((b * t + i) * ld + part * c + h * hs + d);
      };
      auto sees = [&](std::int64_t i, std::int64_t j) { return !s.causal || j <= i; };
      const auto n = static_cast<std::size_t>(t);
      std::vector<double> S(n * n), P(n * n), K(n * n, 0), Es(n * n), dP(n * n), dS(n * n), Eds(n * n), Ep(n * n);
      for (std::int64_t i = 0; i < t; ++i) {
        double top = -INFINITY, low = INFINITY, es_max = 0;
        for (std::int64_t j = 0; j < t && sees(i, j); ++j) {
          double dot = 0, absolute = 0;
          for (std::int64_t d = 0; d < hs; ++d) dot += q(i, d) * k(j, d), absolute += std::fabs(q(i, d) * k(j, d));
          const std::size_t ij = static_cast<std::size_t>(i * t + j);
          S[ij] = dot * scale;
          Es[ij] = gamma(hs) * absolute * scale + 3 * u * std::fabs(S[ij]);
          K[ij] = drop.keep(i, j);
          top = std::max(top, S[ij]), low = std::min(low, S[ij]), es_max = std::max(es_max, Es[ij]);
        }
        const std::int64_t seen = s.causal ? i + 1 : t, tiles = (seen + math::kFlashTile - 1) / math::kFlashTile;
        double total = 0;
        for (std::int64_t j = 0; j < seen; ++j) total += std::exp(S[i * t + j] - top);
        const double lse = top + std::log(total);
        const double eps_w = 2 * es_max + static_cast<double>(5 * tiles + 9) * u + 2 * u * (top - low) + kExpError;
        for (std::int64_t j = 0; j < seen; ++j) P[i * t + j] = std::exp(S[i * t + j] - lse);
        for (std::int64_t d = 0; d < hs; ++d) {
          double out = 0, weighted = 0;
          for (std::int64_t j = 0; j < seen; ++j)
            out += P[i * t + j] * K[i * t + j] * v(j, d), weighted += P[i * t + j] * K[i * t + j] * std::fabs(v(j, d));
          r.y[y_at(i, d)] = out;
          r.y_bound[y_at(i, d)] = 2 * (eps_w + gamma(t)) * weighted + u * std::fabs(out);
        }
        r.lse[bh * t + i] = lse;
        r.lse_bound[bh * t + i] = es_max + eps_w + gamma(t) + 2 * u * std::fabs(lse);
      }
      // Backward.
      for (std::int64_t i = 0; i < t; ++i) {
        const std::int64_t seen = s.causal ? i + 1 : t;
        double delta = 0, e_delta = 0;
        for (std::int64_t d = 0; d < hs; ++d) {
          delta += g(i, d) * r.y[y_at(i, d)];
          e_delta += gamma(hs) * std::fabs(g(i, d) * r.y[y_at(i, d)]) + std::fabs(g(i, d)) * r.y_bound[y_at(i, d)];
        }
        const double e_lse = r.lse_bound[bh * t + i];
        for (std::int64_t j = 0; j < seen; ++j) {
          const std::size_t ij = static_cast<std::size_t>(i * t + j);
          double dot = 0, absolute = 0;
          for (std::int64_t d = 0; d < hs; ++d) dot += g(i, d) * v(j, d), absolute += std::fabs(g(i, d) * v(j, d));
          dP[ij] = K[ij] * dot;
          const double e_dp = K[ij] * gamma(hs) * absolute + 2 * u * std::fabs(dP[ij]);
          Ep[ij] = Es[ij] + e_lse + u * std::fabs(S[ij] - r.lse[bh * t + i]) + kExpError;
          dS[ij] = P[ij] * (dP[ij] - delta) * scale;
          Eds[ij] = scale * P[ij] * (Ep[ij] * std::fabs(dP[ij] - delta) + e_dp + e_delta) + 4 * u * std::fabs(dS[ij]);
        }
      }
      for (std::int64_t i = 0; i < t; ++i)
        for (std::int64_t d = 0; d < hs; ++d) {
          double dq = 0, e = 0, a = 0;
          for (std::int64_t j = 0; j < t && sees(i, j); ++j) {
            const std::size_t ij = static_cast<std::size_t>(i * t + j);
            dq += dS[ij] * k(j, d), e += Eds[ij] * std::fabs(k(j, d)), a += std::fabs(dS[ij] * k(j, d));
          }
          r.grad[grad_at(0, i, d)] = dq, r.grad_bound[grad_at(0, i, d)] = e + gamma(t + 1) * a;
        }
      for (std::int64_t j = 0; j < t; ++j)
        for (std::int64_t d = 0; d < hs; ++d) {
          double dk = 0, ek = 0, ak = 0, dv = 0, ev = 0, av = 0;
          for (std::int64_t i = 0; i < t; ++i) {
            if (!sees(i, j)) continue;
            const std::size_t ij = static_cast<std::size_t>(i * t + j);
            dk += dS[ij] * q(i, d), ek += Eds[ij] * std::fabs(q(i, d)), ak += std::fabs(dS[ij] * q(i, d));
            const double w = P[ij] * K[ij];
            dv += w * g(i, d), ev += (Ep[ij] + 3 * u) * w * std::fabs(g(i, d)), av += w * std::fabs(g(i, d));
          }
          r.grad[grad_at(1, j, d)] = dk, r.grad_bound[grad_at(1, j, d)] = ek + gamma(t + 1) * ak;
          r.grad[grad_at(2, j, d)] = dv, r.grad_bound[grad_at(2, j, d)] = ev + gamma(t + 1) * av;
        }
    }
  return r;
}

// Every element within its bound; returns the largest error as a fraction of its bound.
double expect_within(const std::vector<float>& got, const std::vector<double>& want, const std::vector<double>& bound,
                     const std::string& what) {
  double worst = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double error = std::fabs(static_cast<double>(got[i]) - want[i]);
    EXPECT_LE(error, bound[i]) << what << " element " << i << ": " << got[i] << " against " << want[i];
    if (bound[i] > 0) worst = std::max(worst, error / bound[i]);
  }
  return worst;
}

AttentionShape shape_of(const Case& c) {
  AttentionShape s;
  s.batch = c.batch, s.tokens = c.tokens, s.heads = c.heads, s.head_size = c.head_size, s.causal = c.causal;
  s.dropout = c.dropout, s.seed = 77;
  return s;
}

TEST(FlashAttention, WithinItsRoundingsOfAttentionInDouble) {
  for (const Case& c : kCases) {
    const AttentionShape s = shape_of(c);
    const auto qkv = normal(static_cast<std::size_t>(s.batch * s.tokens * 3 * s.heads * s.head_size), 1, 1.5f);
    const auto dy = normal(static_cast<std::size_t>(s.batch * s.tokens * s.heads * s.head_size), 2, 1.0f);
    const Outputs got = run_flash(qkv, dy, s);
    const Reference want = reference(qkv, dy, s);
    const double y = expect_within(got.y, want.y, want.y_bound, c.name() + ": y");
    const double lse = expect_within(got.lse, want.lse, want.lse_bound, c.name() + ": lse");
    const double grad = expect_within(got.grad, want.grad, want.grad_bound, c.name() + ": grad_qkv");
    // The bounds are tight enough to catch a wrong result: under a hundredth of the outputs' size (about a
    // thousandth here), where a wrong key, mask, tile or dropout draw moves an output by its own size.
    double y_scale = 0, y_bound = 0;
    for (std::size_t i = 0; i < want.y.size(); ++i) y_scale = std::max(y_scale, std::fabs(want.y[i])), y_bound = std::max(y_bound, want.y_bound[i]);
    EXPECT_LT(y_bound, 1e-2 * y_scale) << c.name();
    std::printf("%-48s worst error / bound: y %.3f, lse %.3f, grad %.3f\n", c.name().c_str(), y, lse, grad);
  }
}

// Sequences are independent, and dropout draws from each probability's index in the whole batch: the
// second of three sequences alone (first_sequence = 1) gives the bits it has in the whole.
TEST(FlashAttention, ASliceOfTheBatchGivesTheWholesBits) {
  const Case c{3, 70, 2, 16, true, 0.3f};
  AttentionShape whole = shape_of(c), part = whole;
  part.batch = 1, part.first_sequence = 1;
  const std::size_t per = static_cast<std::size_t>(c.tokens * 3 * c.heads * c.head_size),
                    per_y = static_cast<std::size_t>(c.tokens * c.heads * c.head_size),
                    per_lse = static_cast<std::size_t>(c.heads * c.tokens);
  const auto qkv = normal(3 * per, 3, 1.0f), dy = normal(3 * per_y, 4, 1.0f);
  const Outputs all = run_flash(qkv, dy, whole);
  const Outputs one = run_flash(std::vector<float>(qkv.begin() + per, qkv.begin() + 2 * per),
                                std::vector<float>(dy.begin() + per_y, dy.begin() + 2 * per_y), part);
  auto same = [](const std::vector<float>& a, std::size_t at, const std::vector<float>& b, const char* what) {
    for (std::size_t i = 0; i < b.size(); ++i)
      ASSERT_EQ(std::bit_cast<std::uint32_t>(a[at + i]), std::bit_cast<std::uint32_t>(b[i])) << what << " element " << i;
  };
  same(all.y, per_y, one.y, "y");
  same(all.lse, per_lse, one.lse, "lse");
  same(all.grad, per, one.grad, "grad_qkv");
}

// The 16-bit kernels (Kernels::flash_attention_half and its backward) are the float32 kernels on the
// widened qkv, y and dy, each output rounded once: bit for bit, in both formats, on batches the CPU cuts
// into slices (9 sequences: five slices of two and one), with dropout drawn past the first sequence.
TEST(FlashAttention, SixteenBitTensorsGiveTheFloat32KernelsBitsRounded) {
  Kernels& k = kernels(Device::cpu);
  for (const DType dtype : {DType::bfloat16, DType::float16})
    for (const Case& c : std::vector<Case>{{9, 37, 2, 24, true, 0.2f}, {2, 65, 3, 64, false, 0.0f}, {1, 33, 1, 128, true, 0.0f}}) {
      AttentionShape s = shape_of(c);
      s.first_sequence = 3;
      const HalfFormat format = half_format(dtype);
      const std::int64_t n = c.batch * c.tokens * c.heads * c.head_size;
      const Tensor qkv = Tensor::from_host(normal(static_cast<std::size_t>(3 * n), 7, 1.0f), {3 * n}).to(dtype),
                   dy = Tensor::from_host(normal(static_cast<std::size_t>(n), 8, 1.0f), {n}).to(dtype);
      Tensor y = Tensor::empty({n}, Device::cpu, dtype), lse = Tensor::empty({c.batch * c.heads * c.tokens}),
             grad = Tensor::empty({3 * n}, Device::cpu, dtype);
      k.flash_attention_half(format, qkv.data16(), s, lse.data(), y.data16());
      k.flash_attention_backward_half(format, qkv.data16(), y.data16(), lse.data(), dy.data16(), s, grad.data16());
      // The float32 kernels on the widened values; backward reads the 16-bit y, as the op keeps it.
      const Tensor wide_qkv = qkv.to(DType::float32);
      Tensor y32 = Tensor::empty({n}), lse32 = Tensor::empty({c.batch * c.heads * c.tokens}), grad32 = Tensor::empty({3 * n});
      k.flash_attention(wide_qkv.data(), s, lse32.data(), y32.data());
      k.flash_attention_backward(wide_qkv.data(), y.to(DType::float32).data(), lse32.data(), dy.to(DType::float32).data(),
                                 s, grad32.data());
      const std::string what = std::string(dtype_name(dtype)) + " " + c.name();
      EXPECT_EQ(y.to_host(), y32.to(dtype).to_host()) << what << ": y";
      EXPECT_EQ(lse.to_host(), lse32.to_host()) << what << ": lse";
      EXPECT_EQ(grad.to_host(), grad32.to(dtype).to_host()) << what << ": the gradient";
    }
}

TEST(FlashAttention, TheBackendIsFlashOnAGpuForHeadsItTakes) {
  EXPECT_EQ(sdp_backend(Device::cuda, 64), SdpBackend::flash_attention);
  EXPECT_EQ(sdp_backend(Device::cuda, math::kFlashMaxHeadSize + 1), SdpBackend::math);
  EXPECT_EQ(sdp_backend(Device::cpu, 64), SdpBackend::math);
  {
    SdpaKernel flash(SdpBackend::flash_attention);
    EXPECT_EQ(sdp_backend(Device::cpu, 64), SdpBackend::flash_attention);
    {
      SdpaKernel inner(SdpBackend::math);
      EXPECT_EQ(sdp_backend(Device::cuda, 64), SdpBackend::math);
    }
    EXPECT_EQ(sdp_backend(Device::cpu, 64), SdpBackend::flash_attention);
    EXPECT_THROW(sdp_backend(Device::cpu, math::kFlashMaxHeadSize + 1), std::invalid_argument);
  }
  EXPECT_EQ(sdp_backend(Device::cpu, 64), SdpBackend::math);
}

// The op on either backend: the same output and gradient within what separates the two from the exact
// (both are within a few float32 roundings of it, under 1e-6 relative at this shape; the kernel test above
// bounds FlashAttention's element by element). In bfloat16 the outputs, computed from float32 probabilities
// by both and rounded once to bfloat16, are at most one bfloat16 rounding apart each (2 x 2^-8 relative);
// the gradients are not compared there, as the math kernel keeps its probabilities in bfloat16.
TEST(FlashAttention, TheOpGivesTheMathKernelsResultOnEitherBackend) {
  constexpr double kBackendsAgree = 1e-5;
  for (const DType type : {DType::float32, DType::bfloat16}) {
    const std::int64_t b = 2, t = 37, heads = 3, hs = 16;
    const auto values = normal(static_cast<std::size_t>(b * t * 3 * heads * hs), 5, 1.0f);
    const auto grads = normal(static_cast<std::size_t>(b * t * heads * hs), 6, 1.0f);
    std::vector<std::vector<float>> outputs, gradients;
    for (const SdpBackend backend : {SdpBackend::math, SdpBackend::flash_attention}) {
      SdpaKernel scope(backend);
      Tensor qkv = Tensor::from_host(values, {b, t, 3 * heads * hs}).to(type);
      qkv.set_requires_grad(true);
      Tensor y = scaled_dot_product_attention(qkv, heads, true, 0.1f, 9);
      y.backward(Tensor::from_host(grads, y.shape()).to(type));
      outputs.push_back(y.to(DType::float32).to_host());
      gradients.push_back(qkv.grad().to(DType::float32).to_host());
    }
    const bool wide = type == DType::float32;
    const double relative = wide ? kBackendsAgree : 2 * verify::kBfloat16Rounding.unit_roundoff + kBackendsAgree;
    for (std::size_t i = 0; i < outputs[0].size(); ++i)
      ASSERT_NEAR(outputs[1][i], outputs[0][i], relative * std::fabs(outputs[0][i]) + kBackendsAgree)
          << dtype_name(type) << " y " << i;
    for (std::size_t i = 0; wide && i < gradients[0].size(); ++i)
      ASSERT_NEAR(gradients[1][i], gradients[0][i], relative * (1 + std::fabs(gradients[0][i])))
          << dtype_name(type) << " grad " << i;
  }
}

}  // namespace
}  // namespace course::testing
