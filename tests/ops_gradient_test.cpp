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
  EXPECT_THROW(embedding(Tensor::from_host({0, 5}, {2}), Tensor::zeros({5, 3})), std::invalid_argument);
  EXPECT_THROW(embedding(Tensor::from_host({1.5f}, {1}), Tensor::zeros({5, 3})), std::invalid_argument);
  EXPECT_THROW(layer_norm(Tensor::zeros({2, 4}), Tensor::ones({3}), Tensor::zeros({3})), std::invalid_argument);
}

TEST(Broadcasting, ResultShapesFollowNumPy) {
  for (const auto& c : numpy_broadcast_cases()) {
    EXPECT_EQ(add(Tensor::zeros(c.a), Tensor::zeros(c.b)).shape(), c.result) << shape_string(c.a) << shape_string(c.b);
    EXPECT_EQ(mul(Tensor::zeros(c.b), Tensor::zeros(c.a)).shape(), c.result) << shape_string(c.b) << shape_string(c.a);
  }
}

TEST(Broadcasting, IncompatibleShapesAreNamedInTheError) {
  for (const auto& [a, b] : numpy_incompatible_cases()) {
    try {
      add(Tensor::zeros(a), Tensor::zeros(b));
      ADD_FAILURE() << shape_string(a) << " + " << shape_string(b) << " was accepted";
    } catch (const std::invalid_argument& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(shape_string(a)), std::string::npos) << what;
      EXPECT_NE(what.find(shape_string(b)), std::string::npos) << what;
      EXPECT_NE(what.find("do not broadcast"), std::string::npos) << what;
    }
  }
}

TEST(Broadcasting, GradientsKeepEachOperandsShape) {
  // [1, 1, 5] + [4, 5]: the first operand's gradient sums over the 4 rows it was stretched across.
  Tensor a = Tensor::ones({1, 1, 5}).set_requires_grad(true), b = Tensor::ones({4, 5}).set_requires_grad(true);
  sum(add(a, b)).backward();
  EXPECT_EQ(a.grad().shape(), (Shape{1, 1, 5}));
  EXPECT_EQ(a.grad().to_host(), std::vector<float>(5, 4.0f));
  EXPECT_EQ(b.grad().shape(), (Shape{4, 5}));
  EXPECT_EQ(b.grad().to_host(), std::vector<float>(20, 1.0f));
}

TEST(Dropout, DropsAboutPAndIsRepeatable) {
  Tensor x = Tensor::ones({100, 100});
  auto y = dropout(x, 0.25f, 9).to_host();
  EXPECT_EQ(y, dropout(x, 0.25f, 9).to_host());  // the same seed, the same mask
  EXPECT_NE(y, dropout(x, 0.25f, 10).to_host());
  std::size_t dropped = 0;
  for (float v : y) {
    EXPECT_TRUE(v == 0.0f || v == 1.0f / 0.75f) << v;
    dropped += v == 0.0f;
  }
  // 10000 draws at p = 0.25: the count's standard deviation is about 43, so 2500 +- 250 is six of them.
  EXPECT_NEAR(static_cast<double>(dropped), 2500.0, 250.0);
  EXPECT_EQ(dropout(x, 0.0f, 9).to_host(), x.to_host());
  EXPECT_THROW(dropout(x, 1.0f, 9), std::invalid_argument);
  EXPECT_THROW(dropout(x, -0.1f, 9), std::invalid_argument);
}

TEST(Gelu, ExactByDefaultAndTanhOnRequest) {
  // PyTorch: F.gelu(torch.tensor(1.0)) = 0.8413447 (exact); approximate="tanh" gives 0.8411920.
  Tensor x = Tensor::from_host({1.0f}, {1});
  EXPECT_NEAR(gelu(x).item(), 0.8413447, 1e-6);
  EXPECT_NEAR(gelu(x, GeluApproximate::tanh).item(), 0.8411920, 1e-6);
}

}  // namespace
}  // namespace course::testing
