// The CPU kernels' speed-ups must not change a result: the arithmetic exp against the true e^x, GELU's
// logistic form against its tanh form, the same bits from 1, 2 and 3 threads, and the caching allocator
// reusing memory without counting it as live.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "common/core/cpu_allocator.h"
#include "common/kernels/kernels.h"
#include "common/kernels/math.h"
#include "common/nn/gpt.h"
#include "common/ops/ops.h"

namespace course::testing {
namespace {

// exp_f32's design bound: Cody-Waite reduction, a Taylor series accurate to half an ulp, and a handful
// of float roundings in the Horner steps.
constexpr double kExpUlps = 2.0;
// GELU through the logistic: a few roundings in the division and product on top of exp's 2 ulp. The
// argument 2u is itself computed in float (at most 3 roundings in the cubic), and e^y turns an absolute
// error d in y into a relative error d: |2u| times 3 ulp more, the same in any float evaluation of GELU.
constexpr double kGeluUlps = 8.0;
constexpr double kArgumentRoundings = 3.0;
// Where GELU's value falls below this (x < -9) it may flush to 0: nothing a float32 network adds to a value
// of order 1 can see it. The tanh form in float is 0 already below x = -5.5, where tanhf(u) is -1.
constexpr double kNegligible = 1e-30;

double ulp_of(double value) {
  const auto f = static_cast<float>(value);
  return std::nextafter(std::fabs(f), std::numeric_limits<float>::infinity()) - std::fabs(f);
}

TEST(ExpF32, WithinTwoUlpOfTheTrueExponentialOverTheWholeRange) {
  double worst = 0;
  float worst_x = 0;
  for (double t = 0; t <= 1; t += 1.0 / 400000) {
    const auto x = static_cast<float>(math::kExpMin + t * (math::kExpMax - math::kExpMin));
    const double truth = std::exp(static_cast<double>(x));
    const double error = std::fabs(math::exp_f32(x) - truth) / ulp_of(truth);
    if (error > worst) worst = error, worst_x = x;
  }
  EXPECT_LE(worst, kExpUlps) << "at x = " << worst_x;
}

TEST(ExpF32, EdgesAreThoseOfExp) {
  EXPECT_EQ(math::exp_f32(0.0f), 1.0f);
  EXPECT_EQ(math::exp_f32(-std::numeric_limits<float>::infinity()), 0.0f);
  EXPECT_EQ(math::exp_f32(-100.0f), 0.0f);
  EXPECT_EQ(math::exp_f32(89.0f), std::numeric_limits<float>::infinity());
  EXPECT_EQ(math::exp_f32(std::numeric_limits<float>::infinity()), std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(math::exp_f32(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_LT(math::exp_f32(88.7f), std::numeric_limits<float>::infinity());  // e^88.7 is still a float
}

// erf_f32's bound: its double-precision series and continued fraction are within 1e-11 of erf, so the
// one rounding to float is all that remains, but for the values that fall within 1e-11 of a midpoint
// between two floats: at most one ulp.
constexpr double kErfUlps = 1.0;

TEST(ErfF32, WithinOneUlpOfTheTrueErrorFunction) {
  double worst = 0;
  float worst_x = 0;
  for (double x = -6; x <= 6; x += 1.0 / 65536) {
    const auto xf = static_cast<float>(x);
    const double truth = std::erf(static_cast<double>(xf));
    const double error = std::fabs(math::erf_f32(xf) - truth) / ulp_of(truth == 0 ? 1e-45 : truth);
    if (error > worst) worst = error, worst_x = xf;
  }
  EXPECT_LE(worst, kErfUlps) << "at x = " << worst_x;
}

TEST(ErfF32, EdgesAreThoseOfErf) {
  EXPECT_EQ(math::erf_f32(0.0f), 0.0f);
  EXPECT_EQ(math::erf_f32(4.0f), 1.0f);
  EXPECT_EQ(math::erf_f32(-std::numeric_limits<float>::infinity()), -1.0f);
  EXPECT_EQ(math::erf_f32(std::numeric_limits<float>::infinity()), 1.0f);
  EXPECT_TRUE(std::isnan(math::erf_f32(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_LT(math::erf_f32(3.5f), 1.0f);  // erfc(3.5) = 7.4e-7: a dozen ulps below 1
  for (float x : {0.1f, 1.0f, 1.99f, 2.0f, 3.0f}) EXPECT_EQ(math::erf_f32(-x), -math::erf_f32(x)) << x;
}

// Clipping's sum of squares in the GPU's tiled order (squares_tiled, both devices' add_squares): the same sum
// as a plain loop in long double, within double's rounding of its adds (n of them at most, each within half
// an ulp of a partial sum no larger than the total), at sizes below, at and past one tile.
TEST(SquaresTiled, IsTheSumOfSquaresWithinDoublesRounding) {
  for (const std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{255}, std::size_t{32768}, std::size_t{(1 << 20) + 3}}) {
    const Tensor x = Tensor::randn({static_cast<std::int64_t>(std::max<std::size_t>(n, 1))}, 17);
    const float* values = x.data();
    long double exact = 0.25L;
    for (std::size_t i = 0; i < n; ++i) exact += static_cast<long double>(values[i]) * values[i];
    const double tiled = squares_tiled(values, n, 0.25);
    EXPECT_LE(std::fabs(static_cast<long double>(tiled) - exact), static_cast<long double>(n + 1) * 0x1p-53L * exact) << n;
  }
  // And its order is its own: a different total from the plain loop's on a million terms shows it is not a
  // loop in index order (the parity test then holds the GPU to these bits).
  const Tensor x = Tensor::randn({1 << 20}, 18);
  double plain = 0;
  for (std::int64_t i = 0; i < x.numel(); ++i) plain += static_cast<double>(x.data()[i]) * x.data()[i];
  EXPECT_NE(squares_tiled(x.data(), static_cast<std::size_t>(x.numel()), 0.0), plain);
}

// squares_tiled leaves out the tiling's threads that hold no element; the bits are those of every one of
// its 32,768 threads and 128 folds, written out here as the CUDA kernel runs them, at sizes around a
// block's and the tiling's edges, from totals of +0, -0 and 0.25, with an infinity and a NaN among them.
TEST(SquaresTiled, LeavingOutTheEmptyThreadsChangesNoBit) {
  const auto every_thread = [](const float* in, std::size_t n, double total) {
    const std::size_t threads = kSquaresThreads, stride_all = threads * kSquaresBlocks;
    std::vector<double> share(threads);
    for (std::size_t b = 0; b < static_cast<std::size_t>(kSquaresBlocks); ++b) {
      for (std::size_t t = 0; t < threads; ++t) {
        double sum = 0.0;
        for (std::size_t i = b * threads + t; i < n; i += stride_all) sum = sum + static_cast<double>(in[i]) * in[i];
        share[t] = sum;
      }
      for (std::size_t stride = threads / 2; stride > 0; stride /= 2)
        for (std::size_t t = 0; t < stride; ++t) share[t] = share[t] + share[t + stride];
      total = total + share[0];
    }
    return total;
  };
  const Tensor x = Tensor::randn({70000}, 19);
  std::vector<float> values(x.data(), x.data() + x.numel());
  for (const std::size_t n : {0, 1, 2, 3, 24, 255, 256, 257, 300, 1000, 32767, 32768, 32769, 65537, 70000})
    for (const double start : {0.0, -0.0, 0.25})
      EXPECT_EQ(std::bit_cast<std::uint64_t>(squares_tiled(values.data(), n, start)),
                std::bit_cast<std::uint64_t>(every_thread(values.data(), n, start))) << n << " from " << start;
  for (const float odd : {INFINITY, NAN}) {
    std::vector<float> with = values;
    with[260] = odd;
    for (const std::size_t n : {261, 40000})
      EXPECT_EQ(std::bit_cast<std::uint64_t>(squares_tiled(with.data(), n, 0.0)),
                std::bit_cast<std::uint64_t>(every_thread(with.data(), n, 0.0))) << n << " with " << odd;
  }
}

// Column sums in the GPU's two stages (math::column_chunks), the one order of sum_rows and of layer norm's
// parameter gradients on both devices: each column over each chunk of kColumnChunk rows in order, in double,
// then the chunks in order, written here from that description; and within double's rounding of the exact
// column sums, at no rows, one chunk, its edges and many chunks.
TEST(ColumnSums, AreTheTwoStagesOfTheGpusOrder) {
  const std::size_t chunk = math::kColumnChunk;
  for (const std::size_t rows : {std::size_t{0}, std::size_t{1}, chunk - 1, chunk, chunk + 1, 10 * chunk + 3}) {
    const std::size_t cols = 37;
    const Tensor x = Tensor::randn({static_cast<std::int64_t>(std::max<std::size_t>(rows, 1)), 37}, 31);
    const Tensor g = Tensor::randn(x.shape(), 32), w = Tensor::randn({37}, 33), b = Tensor::randn({37}, 34);
    std::vector<float> sums(cols), out(x.numel()), mean(std::max<std::size_t>(rows, 1)), rstd(mean.size()), dx(out.size()),
        dw(cols), db(cols);
    Kernels& k = kernels(Device::cpu);
    k.sum_rows(x.data(), rows, cols, sums.data());
    k.layer_norm(x.data(), w.data(), b.data(), rows, cols, 1e-5f, out.data(), mean.data(), rstd.data());
    k.layer_norm_backward(x.data(), w.data(), mean.data(), rstd.data(), g.data(), rows, cols, dx.data(), dw.data(), db.data());
    for (std::size_t c = 0; c < cols; ++c) {
      double total = 0, total_w = 0, total_b = 0;
      long double exact = 0, magnitude = 0;
      for (std::size_t first = 0; first < rows; first += chunk) {
        double part = 0, part_w = 0, part_b = 0;
        for (std::size_t r = first; r < std::min(rows, first + chunk); ++r) {
          const float v = x.data()[r * cols + c], gv = g.data()[r * cols + c];
          part += static_cast<double>(v);
          part_w += static_cast<double>(gv) * (static_cast<double>(v - mean[r]) * static_cast<double>(rstd[r]));
          part_b += static_cast<double>(gv);
          exact += v, magnitude += std::fabs(v);
        }
        total += part, total_w += part_w, total_b += part_b;
      }
      EXPECT_EQ(sums[c], static_cast<float>(total)) << rows << " rows, column " << c;
      EXPECT_EQ(dw[c], static_cast<float>(total_w)) << rows << " rows, column " << c;
      EXPECT_EQ(db[c], static_cast<float>(total_b)) << rows << " rows, column " << c;
      // Rounded once to float32 from a double within rows + 1 double roundings of the exact sum.
      EXPECT_NEAR(sums[c], static_cast<double>(exact),
                  0x1p-24 * std::fabs(static_cast<double>(exact)) + static_cast<double>(rows + 1) * 0x1p-53 * static_cast<double>(magnitude))
          << rows;
    }
  }
}

// The reference in double also goes through the logistic: in 1 + tanh u itself even double cancels to
// nothing once u < -19 (x below about -7).
TEST(GeluTanh, WithinAFewUlpOfTheDoublePrecisionFunction) {
  double worst = 0;
  float worst_x = 0;
  for (double x = -12; x <= 12; x += 1.0 / 4096) {
    const auto xf = static_cast<float>(x);
    const double xd = xf;
    const double u = 0.7978845608028654 * (xd + 0.044715 * xd * xd * xd);
    const double truth = xd / (1 + std::exp(-2 * u));  // 0.5 x (1 + tanh u)
    const double difference = std::fabs(math::gelu_tanh(xf) - truth);
    if (std::fabs(truth) < kNegligible) {
      EXPECT_LE(difference, kNegligible) << "at x = " << xf;
      continue;
    }
    const double error = difference / ulp_of(truth) - kArgumentRoundings * std::fabs(2 * u);
    if (error > worst) worst = error, worst_x = xf;
  }
  EXPECT_LE(worst, kGeluUlps) << "ulp beyond the argument's rounding, at x = " << worst_x;
}

// The kernels' loops run vectorised (and, on a machine with AVX2, as the AVX2 version): every element must
// still be the scalar formula's value, bit for bit, as the CUDA parity tests assume of the reference.
TEST(CpuKernels, VectorLoopsGiveTheScalarFormulasBits) {
  std::vector<float> x(100003), g(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    x[i] = -12.0f + 24.0f * static_cast<float>(i) / static_cast<float>(x.size());
    g[i] = 0.5f + static_cast<float>(i % 7);
  }
  std::vector<float> out(x.size()), grad(x.size());
  for (UnaryOp op : {UnaryOp::relu, UnaryOp::gelu, UnaryOp::gelu_tanh}) {
    kernels(Device::cpu).unary(op, x.data(), out.data(), x.size());
    kernels(Device::cpu).unary_backward(op, x.data(), g.data(), grad.data(), x.size());
    std::size_t mismatches = 0;
    for (std::size_t i = 0; i < x.size(); ++i) {
      const float y = math::unary(op, x[i]), d = math::unary_backward(op, x[i], g[i]);
      mismatches += std::memcmp(&y, &out[i], sizeof y) != 0 || std::memcmp(&d, &grad[i], sizeof d) != 0;
    }
    EXPECT_EQ(mismatches, 0u) << "op " << static_cast<int>(op);
  }
}

// OpenBLAS's GEMM stays on one thread: its kernels do not all give the same bits at every thread count
// (kernels.h), and this checks the course's own.
std::vector<float> gpt_gradients_with(int threads) {
  set_cpu_threads(threads, 1);
  nn::GPTConfig config;
  config.n_layer = 2;
  config.n_head = 4;
  config.n_embd = 64;  // [240 x 8, 256] activations: far above the threads' grain
  config.block_size = 8;
  config.vocab_size = 12;
  nn::GPT gpt(config, Device::cpu, 7);
  std::vector<float> ids(240 * 8), targets(240 * 8);
  for (std::size_t i = 0; i < ids.size(); ++i) {
    ids[i] = static_cast<float>((i * 7 + 3) % 12);
    targets[i] = i % 3 == 0 ? -100.0f : static_cast<float>((i * 5 + 1) % 12);
  }
  cross_entropy(gpt(Tensor::from_host(ids, {240, 8})), Tensor::from_host(targets, {240 * 8})).backward();
  std::vector<float> all;
  for (const auto& p : gpt.parameters()) {
    auto g = p.grad().to_host();
    all.insert(all.end(), g.begin(), g.end());
  }
  return all;
}

TEST(CpuThreads, AGptsGradientsAreTheSameBitsWithOurKernelsOnOneTwoAndThreeThreads) {
  const int before = cpu_threads();
  const auto one = gpt_gradients_with(1), two = gpt_gradients_with(2), three = gpt_gradients_with(3);
  set_cpu_threads(before);
  ASSERT_EQ(one.size(), two.size());
  EXPECT_EQ(std::memcmp(one.data(), two.data(), one.size() * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(one.data(), three.data(), one.size() * sizeof(float)), 0);
}

TEST(CachingAllocator, ReusesAFreedBlockButCountsOnlyLiveTensors) {
  const auto live_before = memory_stats(Device::cpu).current_total;
  const std::size_t bytes = 3 * 1000 * 1000 * sizeof(float);
  void* first = nullptr;
  {
    Tensor t = Tensor::empty({3, 1000, 1000});
    first = t.data();
    EXPECT_EQ(memory_stats(Device::cpu).current_total, live_before + static_cast<std::int64_t>(bytes));
  }
  EXPECT_EQ(memory_stats(Device::cpu).current_total, live_before);  // freed: not live, whatever the cache holds
#if defined(__SANITIZE_ADDRESS__)
  EXPECT_FALSE(cpu_allocator::caching_enabled()) << "a cache would hide a use after free from AddressSanitizer";
#else
  ASSERT_TRUE(cpu_allocator::caching_enabled());
  EXPECT_GE(cpu_allocator::cached_bytes(), bytes);
  Tensor again = Tensor::empty({1000, 3000});  // the same size, another shape
  EXPECT_EQ(again.data(), first);
  cpu_allocator::empty_cache();
  EXPECT_EQ(cpu_allocator::cached_bytes(), 0u);
#endif
}

}  // namespace
}  // namespace course::testing
