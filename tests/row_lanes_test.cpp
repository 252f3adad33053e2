// The row kernels' lanes (common/kernels/rows.h) on the CPU: the GPU's way of running a row (a group of
// kLanes threads, each adding every kLanes-th term, the partials folded in lane order) written here from
// that description, against the CPU kernels, bit for bit; and the arithmetic logarithm against the true one.
// kernel_parity_test checks the CUDA kernels against the same CPU kernels where a GPU is at hand.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>
#include <vector>

#include "common/kernels/kernels.h"
#include "common/kernels/rows.h"
#include "common/tensor/tensor.h"

namespace course::testing {
namespace {

// log_f64's bound: the series is exact to 1e-20 of log m; s = (m - 1)/(m + 1) carries two roundings,
// which 2 atanh carries through, and the Horner steps and the final additions about one more: about 1.5
// ulp of log m. Where x is just above sqrt 2 (e = 1, m just above 1/sqrt 2), e ln 2 and log m cancel to
// half of ln 2, so log m's ulp is two of the result's: at most 3 ulp of the result (measured: 2.06).
constexpr double kLogUlps = 3.0;

double ulp_of_double(double value) {
  return std::nextafter(std::fabs(value), std::numeric_limits<double>::infinity()) - std::fabs(value);
}

TEST(LogF64, WithinThreeUlpOfTheTrueLogarithm) {
  double worst = 0, worst_x = 0;
  auto check = [&](double x) {
    const long double truth = std::log(static_cast<long double>(x));
    if (truth == 0.0L) {
      EXPECT_EQ(math::log_f64(x), 0.0) << x;
      return;
    }
    const double error = static_cast<double>(std::fabs(static_cast<long double>(math::log_f64(x)) - truth)) /
                         ulp_of_double(static_cast<double>(truth));
    if (error > worst) worst = error, worst_x = x;
  };
  for (double t = 1.0; t <= 65536.0; t += 1.0 / 64) check(t);  // a cross-entropy's sums: 1 to the vocabulary
  for (double e = -1074.0; e < 1024.0; e += 1.0 / 128) check(std::exp2(e));  // every binade, subnormals too
  for (double x = 0.5; x < 2.0; x += 1.0 / 65536) check(x);   // near 1, where log is small
  EXPECT_LE(worst, kLogUlps) << "at x = " << worst_x;
}

TEST(LogF64, EdgesAreThoseOfLog) {
  constexpr double inf = std::numeric_limits<double>::infinity();
  EXPECT_EQ(math::log_f64(1.0), 0.0);
  EXPECT_EQ(math::log_f64(0.0), -inf);
  EXPECT_EQ(math::log_f64(inf), inf);
  EXPECT_TRUE(std::isnan(math::log_f64(-1.0)));
  EXPECT_TRUE(std::isnan(math::log_f64(std::numeric_limits<double>::quiet_NaN())));
  EXPECT_TRUE(std::isnan(math::log_f64(-inf)));
}

// One GPU thread's view of a row, from the description: its lane visits elements lane, lane + kLanes, ...;
// a sum is every lane's float partial (from zero, in order), then the partials in lane order in double;
// a maximum starts every lane at x[0] and folds the lanes in order.
struct ModelLanes {
  std::size_t lane;
  template <class Term>
  double sum(std::size_t n, Term term) const {
    float acc[math::kLanes] = {};
    for (std::size_t l = 0; l < math::kLanes; ++l)
      for (std::size_t i = l; i < n; i += math::kLanes) acc[l] = acc[l] + term(i);
    double total = 0;
    for (const float a : acc) total = total + static_cast<double>(a);
    return total;
  }
  float max(const float* x, std::size_t n) const {
    float acc[math::kLanes];
    for (std::size_t l = 0; l < math::kLanes; ++l) {
      acc[l] = x[0];
      for (std::size_t i = l; i < n; i += math::kLanes) acc[l] = acc[l] < x[i] ? x[i] : acc[l];
    }
    float top = acc[0];
    for (const float a : acc) top = top < a ? a : top;
    return top;
  }
  std::size_t first() const { return lane; }
  static constexpr std::size_t stride() { return math::kLanes; }
};

void expect_same_bits(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  std::size_t mismatches = 0, first = 0;
  for (std::size_t i = 0; i < want.size(); ++i)
    if (std::bit_cast<std::uint32_t>(got[i]) != std::bit_cast<std::uint32_t>(want[i]) && mismatches++ == 0) first = i;
  EXPECT_EQ(mismatches, 0u) << what << ": first at element " << first << ", " << got[first] << " against " << want[first];
}

// Rows of every width around the lanes (fewer than kLanes, a multiple, one past), GPT-2's width and a
// vocabulary's; values of mixed scales, a zero of each sign, and targets at the row's edges and ignored.
TEST(RowLanes, TheGpusLaneGroupsGiveTheCpuKernelsBits) {
  for (const std::size_t cols : {std::size_t{1}, std::size_t{7}, std::size_t{8}, std::size_t{9}, std::size_t{63},
                                 std::size_t{768}, std::size_t{50304}}) {
    const std::size_t rows = cols > 1000 ? 5 : 37;
    const std::string shape = std::to_string(rows) + " x " + std::to_string(cols);
    std::vector<float> x = Tensor::randn({static_cast<std::int64_t>(rows * cols)}, 41).to_host();
    const std::vector<float> g = Tensor::randn({static_cast<std::int64_t>(rows * cols)}, 42).to_host();
    const std::vector<float> w = Tensor::randn({static_cast<std::int64_t>(cols)}, 43).to_host();
    const std::vector<float> b = Tensor::randn({static_cast<std::int64_t>(cols)}, 44).to_host();
    for (std::size_t i = 0; i < x.size(); ++i) x[i] *= i % 5 == 0 ? 40.0f : (i % 5 == 1 ? 1e-3f : 1.0f);
    x[0] = -0.0f, x[x.size() / 2] = 0.0f;
    std::vector<float> targets(rows), row_grads(rows);
    for (std::size_t r = 0; r < rows; ++r) {
      targets[r] = r % 4 == 3 ? -100.0f : static_cast<float>(r % 2 ? cols - 1 : (r * 13) % cols);
      row_grads[r] = 0.25f + static_cast<float>(r % 3);
    }

    // The CPU kernels.
    Kernels& k = kernels(Device::cpu);
    std::vector<float> out(x.size()), mean(rows), rstd(rows), dx(x.size()), dw(cols), db(cols), losses(rows), dlogits(x.size());
    k.layer_norm(x.data(), w.data(), b.data(), rows, cols, 1e-5f, out.data(), mean.data(), rstd.data());
    k.layer_norm_backward(x.data(), w.data(), mean.data(), rstd.data(), g.data(), rows, cols, dx.data(), dw.data(), db.data());
    k.cross_entropy(x.data(), targets.data(), rows, cols, losses.data());
    k.cross_entropy_backward(x.data(), targets.data(), row_grads.data(), rows, cols, dlogits.data());

    // The GPU's groups, lane by lane: each lane writes its own elements, lane 0 the row's figures.
    std::vector<float> m_out(x.size()), m_mean(rows), m_rstd(rows), m_dx(x.size()), m_losses(rows), m_dlogits(x.size());
    for (std::size_t r = 0; r < rows; ++r)
      for (std::size_t lane = 0; lane < math::kLanes; ++lane) {
        const ModelLanes lanes{lane};
        const float* row = x.data() + r * cols;
        math::layer_norm_row(lanes, row, w.data(), b.data(), cols, 1e-5f, m_out.data() + r * cols, &m_mean[r], &m_rstd[r]);
        math::layer_norm_backward_row(lanes, row, w.data(), mean[r], rstd[r], g.data() + r * cols, cols, m_dx.data() + r * cols);
        if (targets[r] < 0.0f) {
          m_losses[r] = 0.0f;
          for (std::size_t c = lane; c < cols; c += math::kLanes) m_dlogits[r * cols + c] = 0.0f;
          continue;
        }
        const auto target = static_cast<std::size_t>(targets[r]);
        if (lane == 0) m_losses[r] = math::cross_entropy_row(lanes, row, cols, target);
        math::cross_entropy_backward_row(lanes, row, cols, target, row_grads[r], m_dlogits.data() + r * cols);
      }
    expect_same_bits(out, m_out, "layer norm " + shape);
    expect_same_bits(mean, m_mean, "layer norm's means " + shape);
    expect_same_bits(rstd, m_rstd, "layer norm's 1/std " + shape);
    expect_same_bits(dx, m_dx, "layer norm's input gradient " + shape);
    expect_same_bits(losses, m_losses, "cross-entropy " + shape);
    expect_same_bits(dlogits, m_dlogits, "cross-entropy's gradient " + shape);
    // And the losses are what they should be. Each lane adds cols / kLanes positive terms in float, each
    // addition within half an ulp of its partial, each term within exp_f32's 2 ulp: a relative error in
    // the sum, and so an absolute one in its log, of at most (cols / kLanes + 2) ulp at 1; then the loss's
    // own rounding to float32.
    const double bound = (static_cast<double>(cols / math::kLanes) + 2.0) * 0x1p-23;
    for (std::size_t r = 0; r < rows; ++r) {
      if (targets[r] < 0.0f) continue;
      long double top = x[r * cols], total = 0;
      for (std::size_t c = 0; c < cols; ++c) top = std::max<long double>(top, x[r * cols + c]);
      for (std::size_t c = 0; c < cols; ++c) total += std::exp(static_cast<long double>(x[r * cols + c]) - top);
      const auto truth = static_cast<double>(std::log(total) + top - x[r * cols + static_cast<std::size_t>(targets[r])]);
      EXPECT_NEAR(losses[r], truth, bound + 0x1p-24 * std::fabs(truth)) << shape << " row " << r;
    }
  }
}

}  // namespace
}  // namespace course::testing
