// Optimizers against their update rules written out in double, and module registration order.
#include <gtest/gtest.h>

#include <cmath>

#include "common/nn/layers.h"
#include "common/optim/optimizer.h"

namespace course {
namespace {

TEST(Optim, SgdWithMomentumAndWeightDecay) {
  Tensor p = Tensor::from_host({1.0f, -2.0f}, {2}).set_requires_grad(true);
  optim::SGD sgd({p}, 0.1f, 0.9f, 0.01f);
  double w[2] = {1.0, -2.0}, buf[2] = {0, 0};
  const float grads[3][2] = {{0.5f, -1.0f}, {0.25f, 2.0f}, {-1.0f, 0.0f}};
  for (auto& g : grads) {
    p.set_grad(Tensor::from_host({g[0], g[1]}, {2}));
    sgd.step();
    for (int i = 0; i < 2; ++i) {
      double d = g[i] + 0.01 * w[i];
      buf[i] = 0.9 * buf[i] + d;
      w[i] -= 0.1 * buf[i];
    }
  }
  auto got = p.to_host();
  for (int i = 0; i < 2; ++i) EXPECT_NEAR(got[i], w[i], 1e-6);
  EXPECT_EQ(sgd.state().size(), 1u);
}

TEST(Optim, AdamAndAdamW) {
  for (bool decoupled : {false, true}) {
    Tensor p = Tensor::from_host({0.5f}, {1}).set_requires_grad(true);
    optim::Adam adam({p}, 0.01f, 0.9f, 0.999f, 1e-8f, 0.1f, decoupled);
    double w = 0.5, m = 0, v = 0;
    for (int t = 1; t <= 5; ++t) {
      float g = 0.3f * static_cast<float>(t) - 1.0f;
      p.set_grad(Tensor::from_host({g}, {1}));
      adam.step();
      double d = g;
      if (decoupled) w -= 0.01 * 0.1 * w;
      else d += 0.1 * w;
      m = 0.9 * m + 0.1 * d;
      v = 0.999 * v + 0.001 * d * d;
      w -= 0.01 * (m / (1 - std::pow(0.9, t))) / (std::sqrt(v / (1 - std::pow(0.999, t))) + 1e-8);
    }
    EXPECT_NEAR(p.item(), w, 1e-6) << (decoupled ? "AdamW" : "Adam");
  }
}

TEST(Optim, LoadedStateContinuesBitForBit) {
  // Three steps, save, two more; against a fresh optimizer loaded with the saved state and the saved
  // parameters taking the same two steps. Adam's bias correction needs the step count, so it is restored too.
  auto grad = [](int t) { return Tensor::from_host({0.3f * static_cast<float>(t) - 1.0f, 0.7f, -0.2f}, {3}); };
  Tensor p = Tensor::from_host({0.5f, -1.0f, 2.0f}, {3}).set_requires_grad(true);
  optim::Adam adam({p}, 0.01f);
  for (int t = 1; t <= 3; ++t) {
    p.set_grad(grad(t));
    adam.step();
  }
  Tensor q = Tensor::from_host(p.to_host(), {3}).set_requires_grad(true);
  std::vector<std::pair<std::string, Tensor>> saved;
  for (const auto& [name, t] : adam.state()) saved.emplace_back(name, Tensor::from_host(t.to_host(), t.shape()));
  optim::Adam resumed({q}, 0.01f);
  resumed.load_state(saved, adam.steps_taken());
  EXPECT_EQ(resumed.steps_taken(), 3);
  for (int t = 4; t <= 5; ++t) {
    p.set_grad(grad(t));
    adam.step();
    q.set_grad(grad(t));
    resumed.step();
  }
  EXPECT_EQ(p.to_host(), q.to_host());
  // Without the step count the bias correction differs, and so does the result.
  optim::Adam wrong_count({Tensor::from_host({1.0f, 1.0f, 1.0f}, {3}).set_requires_grad(true)}, 0.01f);
  EXPECT_THROW(wrong_count.load_state({{"0.exp_avg", Tensor::zeros({3})}}, 1), std::invalid_argument);  // one missing
  EXPECT_THROW(wrong_count.load_state({{"0.exp_avg", Tensor::zeros({2})}, {"0.exp_avg_sq", Tensor::zeros({3})}}, 1),
               std::invalid_argument);  // a wrong shape
  EXPECT_THROW(wrong_count.load_state({{"0.momentum", Tensor::zeros({3})}, {"0.exp_avg_sq", Tensor::zeros({3})}}, 1),
               std::invalid_argument);  // a wrong name
}

TEST(Optim, RejectsBadLearningRates) {
  Tensor p = Tensor::ones({1}).set_requires_grad(true);
  EXPECT_THROW(optim::SGD({p}, 0.0f), UsageError);
  EXPECT_THROW(optim::SGD({p}, std::nanf("")), UsageError);
  EXPECT_THROW(optim::SGD({p}, -1.0f), UsageError);
}

TEST(Optim, StateIsCountedAsOptimizerMemory) {
  auto before = memory_stats(Device::cpu).current_of(MemoryCategory::optimizer_state);
  Tensor p = Tensor::ones({250}).set_requires_grad(true);
  p.set_grad(Tensor::ones({250}));
  optim::Adam adam({p}, 0.1f);
  adam.step();
  EXPECT_EQ(memory_stats(Device::cpu).current_of(MemoryCategory::optimizer_state) - before, 2 * 250 * 4);
}

TEST(Modules, NamedParametersInStableRegistrationOrder) {
  auto mlp = nn::make_mlp(3, 5, 2, 1, nn::Activation::gelu, Device::cpu, 7);
  std::vector<std::string> names;
  for (auto& [name, p] : mlp->named_parameters()) names.push_back(name);
  EXPECT_EQ(names, (std::vector<std::string>{"0.weight", "0.bias", "2.weight", "2.bias", "4.weight", "4.bias"}));
  EXPECT_EQ(mlp->parameter_count(), 3 * 5 + 5 + 5 * 5 + 5 + 5 + 1);
  auto again = nn::make_mlp(3, 5, 2, 1, nn::Activation::gelu, Device::cpu, 7);
  EXPECT_EQ(mlp->parameters()[2].to_host(), again->parameters()[2].to_host());  // seeded init
  nn::Linear layer(4, 2, Device::cpu, 1);
  for (float w : layer.weight.to_host()) EXPECT_LE(std::fabs(w), 0.5f);  // U(-1/sqrt(4), 1/sqrt(4))
}

}  // namespace
}  // namespace course
