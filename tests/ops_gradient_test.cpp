// Every op's forward value and gradient against an independent double-precision reference:
// gradients by central finite differences of the reference, which carry no float32 rounding.
#include <gtest/gtest.h>

#include "common/tensor/random.h"
#include "support/op_cases.h"

namespace course::testing {
namespace {

// Library values are float32 (about 7 digits); the references are double. 1e-4 leaves room for the
// float rounding of a few chained ops while still catching any wrong rule, whose errors are O(1).
constexpr double kTolerance = 1e-4;
constexpr double kStep = 1e-6;  // central differences in double: truncation ~1e-12, rounding ~1e-10

Values random_values(const Shape& shape, std::uint64_t seed, double low, double high) {
  Values v(static_cast<std::size_t>(shape_numel(shape)));
  for (std::size_t i = 0; i < v.size(); ++i) {
    v[i] = low + (high - low) * random_uniform(seed, i);
    if (std::fabs(v[i]) < 0.05) v[i] += 0.1;  // keep away from relu's kink, where no derivative exists
  }
  return v;
}

Tensor to_tensor(const Values& v, const Shape& shape) {
  std::vector<float> f(v.begin(), v.end());
  return Tensor::from_host(f, shape);
}

class OpGradientTest : public ::testing::TestWithParam<OpCase> {};

TEST_P(OpGradientTest, ForwardAndGradientMatchDoubleReference) {
  const OpCase& c = GetParam();
  std::vector<Values> inputs;
  std::vector<Tensor> tensors;
  for (std::size_t i = 0; i < c.inputs.size(); ++i) {
    // Round the inputs to float first, so library and reference see exactly the same numbers.
    Values v = random_values(c.inputs[i], 11 + i, c.input_low, c.input_high);
    for (auto& x : v) x = static_cast<float>(x);
    inputs.push_back(v);
    tensors.push_back(to_tensor(v, c.inputs[i]).set_requires_grad(true));
  }
  Tensor out = c.op(tensors);
  Values expected = c.reference(inputs);
  ASSERT_EQ(out.numel(), static_cast<std::int64_t>(expected.size()));
  auto got = out.to_host();
  for (std::size_t i = 0; i < expected.size(); ++i)
    EXPECT_NEAR(got[i], expected[i], kTolerance * (1.0 + std::fabs(expected[i]))) << c.name << " output " << i;

  // L = sum(out * w) with fixed random w, so every output element gets a different upstream gradient.
  Values w = random_values(out.shape(), 99, -1.0, 1.0);
  sum(mul(out, to_tensor(w, out.shape()))).backward();
  auto loss_of = [&](const std::vector<Values>& v) {
    Values y = c.reference(v);
    double s = 0.0;
    for (std::size_t i = 0; i < y.size(); ++i) s += y[i] * w[i];
    return s;
  };
  for (std::size_t t = 0; t < inputs.size(); ++t) {
    auto grad = tensors[t].grad().to_host();
    for (std::size_t i = 0; i < inputs[t].size(); ++i) {
      auto plus = inputs, minus = inputs;
      plus[t][i] += kStep;
      minus[t][i] -= kStep;
      double numeric = (loss_of(plus) - loss_of(minus)) / (2 * kStep);
      EXPECT_NEAR(grad[i], numeric, kTolerance * (1.0 + std::fabs(numeric)))
          << c.name << ": d/d input " << t << " element " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllOps, OpGradientTest, ::testing::ValuesIn(op_cases()),
                         [](const auto& info) { return info.param.name; });

TEST(OpErrors, ShapesThatDoNotBroadcastAreRejected) {
  EXPECT_THROW(add(Tensor::zeros({3, 4}), Tensor::zeros({3})), std::invalid_argument);
  EXPECT_THROW(matmul(Tensor::zeros({2, 3}), Tensor::zeros({2, 3})), std::invalid_argument);
  EXPECT_THROW(mse_loss(Tensor::zeros({4, 1}), Tensor::zeros({4})), std::invalid_argument);
  EXPECT_THROW(cross_entropy(Tensor::zeros({2, 3}), Tensor::from_host({0, 3}, {2})), std::invalid_argument);
}

}  // namespace
}  // namespace course::testing
