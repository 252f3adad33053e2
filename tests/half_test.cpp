// 16-bit conversions against independent references: every fp16 and bf16 bit pattern decoded with
// ldexp, every finite one round-tripped, and float32 values rounded to the nearest 16-bit value
// (ties to even) found by search in double precision; the CUDA kernels against the CPU's, bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "common/core/device.h"
#include "common/kernels/half.h"
#include "common/kernels/kernels.h"
#include "common/kernels/rows.h"
#include "common/tensor/random.h"
#include "common/tensor/tensor.h"

namespace course {
namespace {

// fp16 by its definition: (-1)^s * 2^(e-15) * 1.m, or 2^-14 * 0.m when e = 0.
double decode_fp16(std::uint16_t h) {
  const int s = h >> 15, e = (h >> 10) & 0x1F, m = h & 0x3FF;
  const double sign = s ? -1.0 : 1.0;
  if (e == 31) return m ? std::numeric_limits<double>::quiet_NaN() : sign * INFINITY;
  if (e == 0) return sign * std::ldexp(m, -24);
  return sign * std::ldexp(1024 + m, e - 25);
}

TEST(Half, DecodesEveryFloat16AndBfloat16Pattern) {
  for (std::uint32_t h = 0; h <= 0xFFFF; ++h) {
    const auto bits = static_cast<std::uint16_t>(h);
    const double want = decode_fp16(bits);
    const float got = half::from_float16(bits);
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << h;
    } else {
      EXPECT_EQ(static_cast<double>(got), want) << h;
      EXPECT_EQ(half::to_float16(got), bits) << "round trip " << h;
    }
    // bf16 is float32's upper half.
    const float b = half::from_bfloat16(bits);
    std::uint32_t u = static_cast<std::uint32_t>(bits) << 16;
    float expected;
    std::memcpy(&expected, &u, sizeof expected);
    if (std::isnan(expected)) {
      EXPECT_TRUE(std::isnan(b));
    } else {
      EXPECT_EQ(b, expected) << h;
      EXPECT_EQ(half::to_bfloat16(b), bits) << "round trip " << h;
    }
  }
}

// fp16's conversions by their cases, one branch each, as IEEE 754 defines them: the reference for the
// branch-free ones in half.h, which must give the same bits for every value.
std::uint16_t to_float16_by_cases(float f) {
  const std::uint32_t u = math::bits_of(f), sign = (u >> 16) & 0x8000u, a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return 0x7E00u;                                      // NaN: the canonical one
  if (a >= 0x477FF000u) return static_cast<std::uint16_t>(sign | 0x7C00u);  // 65520 and above: infinity
  const int exponent = static_cast<int>(a >> 23);
  if (exponent < 113) {  // below 2^-14: a subnormal half, in units of 2^-24
    if (exponent < 102) return static_cast<std::uint16_t>(sign);  // below 2^-25: rounds to zero
    const std::uint32_t mantissa = (a & 0x7FFFFFu) | 0x800000u;
    return static_cast<std::uint16_t>(sign | half::round_shift(mantissa, 126 - exponent));
  }
  return static_cast<std::uint16_t>(sign | half::round_shift(a - (112u << 23), 13));
}
float from_float16_by_cases(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  std::uint32_t exponent = (h >> 10) & 0x1Fu, mantissa = h & 0x3FFu;
  if (exponent == 0x1F) return math::float_of(sign | 0x7F800000u | (mantissa << 13));
  if (exponent == 0) {
    if (mantissa == 0) return math::float_of(sign);
    int e = -14;  // a subnormal: normalise it
    while (!(mantissa & 0x400u)) mantissa <<= 1, --e;
    return math::float_of(sign | (static_cast<std::uint32_t>(e + 127) << 23) | ((mantissa & 0x3FFu) << 13));
  }
  return math::float_of(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

// Every half; every float whose rounding can be a subnormal half's or the first normal one's (exponents
// 100 to 114, each of their 2^24 patterns with the sign); and at every exponent, every pattern of the 13
// bits rounded away under the mantissas whose rounding carries into the exponent or not.
TEST(Half, Float16ConversionsGiveTheCaseByCaseBitsForEveryKindOfValue) {
  for (std::uint32_t h = 0; h <= 0xFFFF; ++h)
    ASSERT_EQ(math::bits_of(half::from_float16(static_cast<std::uint16_t>(h))),
              math::bits_of(from_float16_by_cases(static_cast<std::uint16_t>(h)))) << std::hex << h;
  const auto check = [](std::uint32_t u) {
    const float f = math::float_of(u);
    if (half::to_float16(f) != to_float16_by_cases(f))
      FAIL() << std::hex << "float bits 0x" << u << ": 0x" << half::to_float16(f) << ", by cases 0x" << to_float16_by_cases(f);
  };
  for (std::uint32_t sign : {0u, 0x80000000u}) {
    for (std::uint32_t u = 100u << 23; u < 115u << 23; ++u) {
      check(sign | u);
      if (::testing::Test::HasFailure()) return;
    }
    for (std::uint32_t exponent = 0; exponent < 256; ++exponent) {
      for (std::uint32_t high : {0u, 1u, 2u, 0x3FEu, 0x3FFu})
        for (std::uint32_t low = 0; low < (1u << 13); ++low) check(sign | exponent << 23 | high << 13 | low);
      if (::testing::Test::HasFailure()) return;
    }
  }
}

// The nearest fp16 to x by search over all finite patterns of its sign, ties to the even pattern.
std::uint16_t nearest_fp16(float x) {
  std::uint16_t best = 0;
  double best_error = INFINITY;
  const std::uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  for (std::uint16_t m = 0; m < 0x7C00; ++m) {
    const auto h = static_cast<std::uint16_t>(sign | m);
    const double error = std::fabs(decode_fp16(h) - static_cast<double>(x));
    if (error < best_error || (error == best_error && (h & 1) == 0)) best = h, best_error = error;
  }
  // Beyond the largest half by half an ulp or more: infinity (IEEE round to nearest).
  if (std::fabs(static_cast<double>(x)) >= 65520.0) best = static_cast<std::uint16_t>(sign | 0x7C00);
  return best;
}

TEST(Half, RoundsFloat32ToTheNearestFloat16) {
  std::vector<float> xs = {0.0f, -0.0f, 1.0f, 65504.0f, 65519.9f, 65520.0f, 1e-8f, 2.9802322e-08f /* 2^-25 */,
                           5.96e-8f, 6.1035e-5f, 0.1f, -3.14159f, 1.0009765625f /* a tie */};
  for (std::uint64_t i = 0; i < 300; ++i) {
    const double u = random_uniform(17, i);
    xs.push_back(static_cast<float>(std::ldexp(u, static_cast<int>(i % 50) - 30) * (i % 2 ? -1 : 1)));
  }
  for (float x : xs) EXPECT_EQ(half::to_float16(x), nearest_fp16(x)) << x;
  EXPECT_TRUE(std::isnan(half::from_float16(half::to_float16(NAN))));
  // Every NaN, of either sign and any payload (x86 keeps them, a GPU does not), narrows to one quiet NaN.
  for (const std::uint32_t nan : {0x7FC00000u, 0xFFC00000u, 0x7F800001u, 0xFF812345u, 0x7FFFFFFFu, 0xFFFFFFFFu}) {
    EXPECT_EQ(half::to_bfloat16(math::float_of(nan)), 0x7FC0) << std::hex << nan;
    EXPECT_EQ(half::to_float16(math::float_of(nan)), 0x7E00) << std::hex << nan;
  }
  EXPECT_EQ(half::to_bfloat16(1.00390625f), 0x3F80) << "1 + 2^-8 is a tie: to even";
  EXPECT_EQ(half::to_bfloat16(1.01171875f), 0x3F82) << "1 + 3 * 2^-8 is a tie: to even, upwards";
}

TEST(Half, CudaKernelsMatchTheCpu) {
  std::string reason;
  if (!cuda_usable(&reason)) GTEST_SKIP() << "no usable GPU: " << reason;
  Tensor x = Tensor::randn({4097}, 5, Device::cpu, 0.0f, 100.0f);
  for (HalfFormat format : {HalfFormat::float16, HalfFormat::bfloat16}) {
    std::vector<std::uint16_t> cpu(4097), gpu(4097);
    kernels(Device::cpu).to_half(format, x.data(), cpu.data(), 4097);
    Tensor on_gpu = x.to(Device::cuda), packed = Tensor::zeros({2049}, Device::cuda);
    kernels(Device::cuda).to_half(format, on_gpu.data(), reinterpret_cast<std::uint16_t*>(packed.data()), 4097);
    auto host = packed.to_host();
    std::memcpy(gpu.data(), host.data(), 4097 * sizeof(std::uint16_t));
    EXPECT_EQ(cpu, gpu);
    Tensor back = Tensor::zeros({4097}, Device::cuda);
    kernels(Device::cuda).from_half(format, reinterpret_cast<const std::uint16_t*>(packed.data()), back.data(), 4097);
    std::vector<float> expected(4097);
    kernels(Device::cpu).from_half(format, cpu.data(), expected.data(), 4097);
    EXPECT_EQ(back.to_host(), expected);
  }
  // Tensors of each 16-bit type convert on the GPU to the CPU's bits, both ways and between the two.
  for (DType dtype : {DType::bfloat16, DType::float16}) {
    Tensor on_cpu = x.to(dtype), on_gpu = x.to(Device::cuda).to(dtype);
    EXPECT_EQ(on_gpu.to_host(), on_cpu.to_host()) << dtype_name(dtype);
    const DType other = dtype == DType::bfloat16 ? DType::float16 : DType::bfloat16;
    EXPECT_EQ(on_gpu.to(other).to_host(), on_cpu.to(other).to_host()) << dtype_name(dtype);
  }
}

// The row views the GPU's 16-bit kernels run the float row formulas on (half::In, half::Out): a row read
// through In is its exact widening, a value stored through Out is rounded once to nearest even, and the
// cross-entropy's gradient through them is the float row's, narrowed: the same bits as the CPU's kernel,
// which widens a row into floats first.
template <HalfFormat F>
void expect_row_views_exact() {
  const std::size_t cols = 1003, target = 17;
  const auto values = Tensor::randn({static_cast<std::int64_t>(cols)}, 9, Device::cpu, 0.0f, 6.0f).to_host();
  std::vector<std::uint16_t> bits(cols), through(cols), narrowed(cols);
  std::vector<float> widened(cols), grad(cols);
  for (std::size_t c = 0; c < cols; ++c) bits[c] = half::narrow<F>(values[c]), widened[c] = half::widen<F>(bits[c]);
  const half::In<F> in{bits.data()};
  for (std::size_t c = 0; c < cols; ++c) ASSERT_TRUE(in[c] == widened[c] || (std::isnan(in[c]) && std::isnan(widened[c])));
  const math::RowExpSum e = math::row_exp_sum(math::AllLanes{}, in, cols), ef = math::row_exp_sum(math::AllLanes{}, widened.data(), cols);
  EXPECT_EQ(e.top, ef.top);
  EXPECT_EQ(e.total, ef.total);
  EXPECT_EQ(math::cross_entropy_of(e, in, target), math::cross_entropy_of(ef, widened.data(), target));
  math::cross_entropy_backward_of(math::AllLanes{}, e, in, cols, target, 0.75f, half::Out<F>{through.data()});
  math::cross_entropy_backward_of(math::AllLanes{}, ef, widened.data(), cols, target, 0.75f, grad.data());
  for (std::size_t c = 0; c < cols; ++c) narrowed[c] = half::narrow<F>(grad[c]);
  EXPECT_EQ(through, narrowed);
}

TEST(Half, RowViewsReadExactlyAndRoundOnce) {
  expect_row_views_exact<HalfFormat::bfloat16>();
  expect_row_views_exact<HalfFormat::float16>();
}

// The 16-bit element-wise kernels (Kernels::binary_half, ...) against the float32 kernels on the widened
// values, rounded once: every one of the 65,536 bit patterns through each activation and its gradient,
// and random pairs through each binary op, with each of the ways binary repeats an operand, at lengths
// that cut the CPU's blocks of 1,024 and the operands' runs anywhere.
std::vector<std::uint16_t> composed(HalfFormat format, std::size_t n,
                                    const std::function<void(float*)>& float32_kernel) {
  std::vector<float> wide(n);
  float32_kernel(wide.data());
  std::vector<std::uint16_t> out(n);
  kernels(Device::cpu).to_half(format, wide.data(), out.data(), n);
  return out;
}
std::vector<float> widened(HalfFormat format, const std::vector<std::uint16_t>& bits) {
  std::vector<float> out(bits.size());
  kernels(Device::cpu).from_half(format, bits.data(), out.data(), bits.size());
  return out;
}
void expect_same_bits(const std::vector<std::uint16_t>& got, const std::vector<std::uint16_t>& expected,
                      const std::string& what) {
  ASSERT_EQ(got.size(), expected.size()) << what;
  const auto at = std::mismatch(got.begin(), got.end(), expected.begin());
  EXPECT_TRUE(at.first == got.end()) << what << ": element " << (at.first - got.begin()) << " is 0x" << std::hex
                                     << *at.first << ", the float32 kernel's rounding 0x" << *at.second;
}

TEST(Half, SixteenBitElementWiseKernelsAreTheFloat32KernelsOnTheWidenedValues) {
  Kernels& k = kernels(Device::cpu);
  std::vector<std::uint16_t> every(1 << 16), shuffled(1 << 16);
  for (std::size_t i = 0; i < every.size(); ++i) every[i] = static_cast<std::uint16_t>(i);
  const auto random = Tensor::rand_uniform({1 << 16}, 21, 0.0f, 65536.0f).to_host();
  for (std::size_t i = 0; i < shuffled.size(); ++i) shuffled[i] = static_cast<std::uint16_t>(random[i]);
  const std::size_t n = every.size();
  for (const HalfFormat format : {HalfFormat::bfloat16, HalfFormat::float16}) {
    const std::string name = format == HalfFormat::bfloat16 ? "bf16 " : "fp16 ";
    const std::vector<float> x = widened(format, every), g = widened(format, shuffled);
    for (const auto& [op, op_name] : std::vector<std::pair<UnaryOp, std::string>>{
             {UnaryOp::relu, "relu"}, {UnaryOp::gelu, "gelu"}, {UnaryOp::gelu_tanh, "gelu_tanh"}}) {
      const std::string what = name + op_name;
      std::vector<std::uint16_t> out(n), grad(n);
      k.unary_half(format, op, every.data(), out.data(), n);
      expect_same_bits(out, composed(format, n, [&](float* r) { k.unary(op, x.data(), r, n); }), what);
      k.unary_backward_half(format, op, every.data(), shuffled.data(), grad.data(), n);
      expect_same_bits(grad, composed(format, n, [&](float* r) { k.unary_backward(op, x.data(), g.data(), r, n); }),
                       what + "'s gradient");
    }
    // a and b of n elements, or one of them a row of 7 (or 1) repeated, or 3 repeated over a length it
    // does not divide; n = 5,003 leaves a short last block.
    const std::size_t m = 5003;
    for (const auto& [an, bn] : std::vector<std::pair<std::size_t, std::size_t>>{{m, m}, {m, 7}, {7, m}, {m, 1}, {1, m}, {m, 3}}) {
      const std::vector<std::uint16_t> a(every.begin(), every.begin() + static_cast<std::ptrdiff_t>(an)),
          b(shuffled.end() - static_cast<std::ptrdiff_t>(bn), shuffled.end());
      const std::vector<float> wa = widened(format, a), wb = widened(format, b);
      for (const auto& [op, op_name] : std::vector<std::pair<BinaryOp, std::string>>{
               {BinaryOp::add, "add"}, {BinaryOp::sub, "sub"}, {BinaryOp::mul, "mul"}, {BinaryOp::max, "max"}}) {
        std::vector<std::uint16_t> out(m);
        k.binary_half(format, op, a.data(), an, b.data(), bn, out.data(), m);
        expect_same_bits(out, composed(format, m, [&](float* r) { k.binary(op, wa.data(), an, wb.data(), bn, r, m); }),
                         name + op_name + ", operands of " +
                             std::to_string(an) + " and " + std::to_string(bn));
      }
    }
    std::vector<float> acc = Tensor::randn({static_cast<std::int64_t>(n)}, 22).to_host(), expected = acc;
    k.add_half(format, every.data(), acc.data(), n);
    k.binary(BinaryOp::add, expected.data(), n, x.data(), n, expected.data(), n);
    for (std::size_t i = 0; i < n; ++i)
      ASSERT_EQ(math::bits_of(acc[i]), math::bits_of(expected[i])) << name << "add_half, element " << i;
  }
}

// The kernels that replace every 16-bit one while a reference computes without them
// (EmulatedHalfKernels: widen, the float32 kernel, round once) give the 16-bit kernels' bits on the CPU,
// kernel by kernel: GEMMs (transposed or not, batched with strides, beta 0 and 1), the element-wise ones
// with repeated operands, the accumulation into float32, attention and the cross-entropy, forward and
// backward, in both formats. And the scope is the thread's, nests and ends.
TEST(Half, KernelsWithoutTheSixteenBitOnesGiveTheirBits) {
  EXPECT_FALSE(EmulatedHalfKernels::active());
  Kernels& plain = kernels(Device::cpu);
  for (const HalfFormat format : {HalfFormat::bfloat16, HalfFormat::float16}) {
    const auto bits = [&](std::size_t n, std::uint64_t seed) {
      const auto v = Tensor::randn({static_cast<std::int64_t>(n)}, seed).to_host();
      std::vector<std::uint16_t> h(n);
      plain.to_half(format, v.data(), h.data(), n);
      return h;
    };
    // Each computation once with the 16-bit kernels and once without, its outputs' bits compared.
    const auto both = [&](const std::string& what, const std::function<std::vector<std::uint16_t>(Kernels&)>& compute) {
      const auto with = compute(kernels(Device::cpu));
      std::vector<std::uint16_t> without;
      {
        EmulatedHalfKernels scope;
        ASSERT_TRUE(EmulatedHalfKernels::active());
        ASSERT_NE(&kernels(Device::cpu), &plain);
        without = compute(kernels(Device::cpu));
      }
      ASSERT_EQ(with.size(), without.size()) << what;
      for (std::size_t i = 0; i < with.size(); ++i) ASSERT_EQ(with[i], without[i]) << what << ", element " << i;
    };
    const std::string name = format == HalfFormat::bfloat16 ? "bf16 " : "fp16 ";
    const std::int64_t batch = 2, m = 5, n = 7, k = 9;
    for (const bool ta : {false, true})
      for (const bool tb : {false, true})
        for (const float beta : {0.0f, 1.0f})
          both(name + "gemm", [&](Kernels& kk) {
            const auto a = bits(batch * m * k, 1), b = bits(k * n, 2);  // b shared by the batch (stride 0)
            auto c = bits(batch * m * n, 3);
            kk.gemm_batched_half(format, ta, tb, batch, m, n, k, 0.5f, a.data(), m * k, b.data(), 0, beta, c.data(), m * n);
            return c;
          });
    const std::size_t count = 1001;
    both(name + "binary", [&](Kernels& kk) {
      const auto a = bits(count, 4), b = bits(7, 5);
      std::vector<std::uint16_t> out(count);
      kk.binary_half(format, BinaryOp::mul, a.data(), count, b.data(), 7, out.data(), count);
      return out;
    });
    both(name + "gelu and its gradient", [&](Kernels& kk) {
      const auto x = bits(count, 6), g = bits(count, 7);
      std::vector<std::uint16_t> out(2 * count);
      kk.unary_half(format, UnaryOp::gelu_tanh, x.data(), out.data(), count);
      kk.unary_backward_half(format, UnaryOp::gelu_tanh, x.data(), g.data(), out.data() + count, count);
      return out;
    });
    both(name + "accumulation into float32", [&](Kernels& kk) {
      const auto x = bits(count, 8);
      std::vector<float> acc = Tensor::randn({static_cast<std::int64_t>(count)}, 9).to_host();
      kk.add_half(format, x.data(), acc.data(), count);
      std::vector<std::uint16_t> out(2 * count);
      std::memcpy(out.data(), acc.data(), count * sizeof(float));
      return out;
    });
    const AttentionShape shape{2, 9, 2, 8};
    const std::size_t qkv_n = 2 * 9 * 3 * 2 * 8, y_n = 2 * 9 * 2 * 8;
    both(name + "attention and its gradient", [&](Kernels& kk) {
      const auto qkv = bits(qkv_n, 10), grad_y = bits(y_n, 11);
      std::vector<float> lse(2 * 2 * 9);
      std::vector<std::uint16_t> y(y_n), grad(qkv_n);
      kk.flash_attention_half(format, qkv.data(), shape, lse.data(), y.data());
      kk.flash_attention_backward_half(format, qkv.data(), y.data(), lse.data(), grad_y.data(), shape, grad.data());
      y.insert(y.end(), grad.begin(), grad.end());
      return y;
    });
    both(name + "cross-entropy and its gradient", [&](Kernels& kk) {
      const std::size_t rows = 6, cols = 11;
      const auto logits = bits(rows * cols, 12);
      const std::vector<float> targets = {3, 0, 10, -1, 7, 5}, grad_losses(rows, 0.25f);
      std::vector<float> losses(rows), top(rows);
      std::vector<double> total(rows);
      std::vector<std::uint16_t> grad(rows * cols);
      kk.cross_entropy_half(format, logits.data(), targets.data(), rows, cols, losses.data(), top.data(), total.data());
      kk.cross_entropy_backward_half(format, logits.data(), targets.data(), grad_losses.data(), top.data(), total.data(),
                                     rows, cols, grad.data());
      std::vector<std::uint16_t> out(2 * rows);
      std::memcpy(out.data(), losses.data(), rows * sizeof(float));
      out.insert(out.end(), grad.begin(), grad.end());
      return out;
    });
  }
  {
    EmulatedHalfKernels outer;
    { EmulatedHalfKernels inner; }
    EXPECT_TRUE(EmulatedHalfKernels::active());  // the outer scope's, after the inner one ended
  }
  EXPECT_FALSE(EmulatedHalfKernels::active());
  EXPECT_EQ(&kernels(Device::cpu), &plain);
}

}  // namespace
}  // namespace course
