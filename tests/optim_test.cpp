// Optimizers against their update rules written out in double, and module registration order.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "common/kernels/kernels.h"
#include "common/kernels/math.h"
#include "common/kernels/multi_tensor.h"
#include "common/nn/layers.h"
#include "common/ops/ops.h"
#include "common/optim/grad_scaler.h"
#include "common/optim/lr_scheduler.h"
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

// Tensors of the awkward sizes: empty ones (first, last and between), one element, a chunk less one, a
// chunk, a chunk and one; 600 of them, so the list takes three launches.
std::vector<std::size_t> awkward_sizes() {
  const std::size_t c = math::kMultiTensorChunk;
  const std::size_t pattern[] = {0, 1, c - 1, c, c + 1, 3, 0, 0, 2 * c + 17, 100};
  std::vector<std::size_t> sizes;
  for (int i = 0; i < 600; ++i) sizes.push_back(pattern[(i * 7) % 10] + (i % 3 == 0 ? i % 5 : 0));
  sizes.push_back(0);
  return sizes;
}

// The GPU's multi-tensor chunking (kernels/multi_tensor.h): every element of every tensor is in exactly one
// chunk of one launch, and no chunk is longer than kMultiTensorChunk.
TEST(MultiTensor, EveryElementIsInExactlyOneChunk) {
  struct Sized {
    std::size_t n;
  };
  std::vector<Sized> list;
  for (std::size_t n : awkward_sizes()) list.push_back({n});
  std::vector<std::vector<int>> seen(list.size());
  for (std::size_t t = 0; t < list.size(); ++t) seen[t].assign(list[t].n, 0);
  int launches = 0;
  math::for_each_multi_tensor_launch(list, [&](const Sized* tensors, int count, const math::MultiTensorChunks& c) {
    ++launches;
    ASSERT_LE(count, math::kMultiTensorLaunch);
    const std::size_t from = static_cast<std::size_t>(tensors - list.data());
    for (std::size_t chunk = 0; chunk < c.first[count]; ++chunk) {
      const math::ChunkRange r = math::multi_tensor_range(c, tensors, chunk);
      ASSERT_GE(r.tensor, 0);
      ASSERT_LT(r.tensor, count);
      ASSERT_LT(r.begin, r.end) << "chunk " << chunk << " of launch " << launches << " is empty";
      ASSERT_LE(r.end - r.begin, math::kMultiTensorChunk);
      for (std::size_t i = r.begin; i < r.end; ++i) ++seen[from + r.tensor].at(i);
    }
  });
  EXPECT_EQ(launches, 3);
  for (std::size_t t = 0; t < list.size(); ++t)
    for (std::size_t i = 0; i < list[t].n; ++i)
      ASSERT_EQ(seen[t][i], 1) << "element " << i << " of tensor " << t << " (" << list[t].n << " elements)";
}

// One list of 601 tensors, each with its own weight decay, updated in one call: each element gets the
// update rule's bits with its own tensor's decay, as if every tensor had been stepped alone.
TEST(MultiTensor, AdamOverAListIsEachTensorsOwnUpdate) {
  const AdamParams a{1e-3f, 0.9f, 0.95f, 1e-8f, true, 0.1f, 0.0975f, /*zero_grad=*/true};
  const std::vector<std::size_t> sizes = awkward_sizes();
  std::vector<std::vector<float>> p(sizes.size()), g(p.size()), m(p.size()), v(p.size());
  std::vector<AdamTensor> list;
  for (std::size_t t = 0; t < sizes.size(); ++t) {
    for (std::size_t i = 0; i < sizes[t]; ++i) {
      p[t].push_back(std::sin(0.37f * static_cast<float>(i + t)));
      g[t].push_back(std::cos(0.11f * static_cast<float>(3 * i + t)));
      m[t].push_back(0.01f * static_cast<float>(i % 7));
      v[t].push_back(0.001f * static_cast<float>(i % 5));
    }
    list.push_back({p[t].data(), g[t].data(), m[t].data(), v[t].data(), sizes[t], 0.01f * static_cast<float>(t % 4)});
  }
  auto want_p = p, want_m = m, want_v = v;
  for (std::size_t t = 0; t < sizes.size(); ++t)
    for (std::size_t i = 0; i < sizes[t]; ++i)
      want_p[t][i] = math::adam_update(want_p[t][i], g[t][i], want_m[t][i], want_v[t][i], a.lr, a.beta1, a.beta2,
                                       a.eps, list[t].weight_decay, true, a.bias_correction1, a.bias_correction2);
  kernels(Device::cpu).adam_step(list, a);
  for (std::size_t t = 0; t < sizes.size(); ++t)
    for (std::size_t i = 0; i < sizes[t]; ++i)
      ASSERT_TRUE(p[t][i] == want_p[t][i] && m[t][i] == want_m[t][i] && v[t][i] == want_v[t][i] && g[t][i] == 0.0f)
          << "element " << i << " of tensor " << t << ": " << p[t][i] << " against " << want_p[t][i] << ", gradient "
          << g[t][i];
}

// zero_grad folded into Adam's launch: step_and_zero_grad() leaves the parameters and moments of step()
// then zero_grad(), bit for bit, and every gradient zero (a parameter without one keeps none).
TEST(Optim, AdamsStepAndZeroGradIsStepThenZeroGrad) {
  const auto make = [] {
    std::vector<Tensor> params;
    for (int i = 0; i < 5; ++i) {
      Tensor p = Tensor::randn({3 + 40 * i}, 80 + i).set_requires_grad(true);
      if (i != 2) p.set_grad(Tensor::randn({3 + 40 * i}, 90 + i));
      params.push_back(p);
    }
    return params;
  };
  std::vector<Tensor> apart = make(), folded = make();
  optim::Adam one(optim::weight_decay_groups(apart, 0.1f), 1e-2f, 0.9f, 0.95f, 1e-8f, true),
      other(optim::weight_decay_groups(folded, 0.1f), 1e-2f, 0.9f, 0.95f, 1e-8f, true);
  for (int step = 0; step < 3; ++step) {
    for (std::size_t i = 0; i < apart.size(); ++i) {
      if (i == 2) continue;  // no gradient
      apart[i].grad().copy_from(Tensor::randn(apart[i].shape(), 100 + step));
      folded[i].grad().copy_from(Tensor::randn(folded[i].shape(), 100 + step));
    }
    one.step();
    one.zero_grad();
    other.step_and_zero_grad();
    for (std::size_t i = 0; i < apart.size(); ++i) {
      EXPECT_EQ(apart[i].to_host(), folded[i].to_host()) << "parameter " << i << " at step " << step;
      if (i == 2) {
        EXPECT_FALSE(folded[i].grad().defined());
        continue;
      }
      for (float g : folded[i].grad().to_host()) ASSERT_EQ(g, 0.0f) << "parameter " << i << "'s gradient";
    }
  }
  const auto a = one.state(), b = other.state();
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i].second.to_host(), b[i].second.to_host()) << a[i].first;
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

TEST(Optim, WeightDecaySkipsBiasesAndNorms) {
  Tensor w = Tensor::ones({2, 2}).set_requires_grad(true), b = Tensor::ones({2}).set_requires_grad(true);
  auto groups = optim::weight_decay_groups({w, b}, 0.1f);
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(groups[0].params.size(), 1u);  // w: two dimensions, decayed
  EXPECT_EQ(groups[1].weight_decay, 0.0f);
  optim::Adam adamw(groups, 0.01f, 0.9f, 0.999f, 1e-8f, true);
  w.set_grad(Tensor::zeros({2, 2}));
  b.set_grad(Tensor::zeros({2}));
  adamw.step();
  // A zero gradient moves nothing but the decoupled decay: w shrinks by lr * wd, b stays.
  EXPECT_EQ(w.to_host(), std::vector<float>(4, 1.0f - 0.01f * 0.1f));
  EXPECT_EQ(b.to_host(), std::vector<float>(2, 1.0f));
}

TEST(Optim, ClipGradNormScalesToTheLimit) {
  Tensor a = Tensor::zeros({2}).set_requires_grad(true), b = Tensor::zeros({1}).set_requires_grad(true);
  a.set_grad(Tensor::from_host({3.0f, 0.0f}, {2}));
  b.set_grad(Tensor::from_host({4.0f}, {1}));
  EXPECT_DOUBLE_EQ(optim::clip_grad_norm_({a, b}, 10.0).item(), 5.0);  // under the limit: unchanged
  EXPECT_EQ(a.grad().to_host(), (std::vector<float>{3.0f, 0.0f}));
  EXPECT_DOUBLE_EQ(optim::clip_grad_norm_({a, b}, 1.0).item(), 5.0);
  EXPECT_NEAR(a.grad().to_host()[0], 0.6, 1e-6);
  EXPECT_NEAR(b.grad().item(), 0.8, 1e-6);
}

TEST(Optim, WarmupThenCosine) {
  // PyTorch: SequentialLR([LinearLR(opt, 0.1, 1.0, total_iters=10), CosineAnnealingLR(opt, T_max=90,
  // eta_min=1e-4)], milestones=[10]) with lr 1e-3 gives these, in closed form.
  auto s = optim::warmup_cosine(1e-3f, 10, 100, 1e-4f);
  EXPECT_NEAR(s->lr_at(0), 1e-4, 1e-9);
  EXPECT_NEAR(s->lr_at(5), 1e-3 * (0.1 + 0.9 * 0.5), 1e-9);
  EXPECT_NEAR(s->lr_at(10), 1e-3, 1e-9);
  EXPECT_NEAR(s->lr_at(55), 1e-4 + 0.9e-3 * (1 + std::cos(M_PI * 45 / 90)) / 2, 1e-9);
  EXPECT_NEAR(s->lr_at(100), 1e-4, 1e-9);
  EXPECT_NEAR(s->lr_at(500), 1e-4, 1e-9);  // held at the minimum after the end
  EXPECT_THROW(optim::warmup_cosine(1e-3f, 10, 10, 0.0f), std::invalid_argument);
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


// ---- GradScaler: torch.amp.GradScaler's semantics and defaults ------------------------------------

TEST(GradScaler, ScalesTheLossAndUnscalesTheGradients) {
  Tensor w = Tensor::from_host({1.0f, -2.0f}, {2}).set_requires_grad(true);
  optim::SGD sgd({w}, 0.1f);
  optim::GradScaler scaler;
  EXPECT_EQ(scaler.get_scale(), 65536.0f);  // 2^16
  Tensor loss = sum(mul(w, Tensor::from_host({3.0f, 5.0f}, {2})));
  Tensor scaled = scaler.scale(loss);
  EXPECT_FLOAT_EQ(scaled.item(), loss.item() * 65536.0f);
  scaled.backward();
  EXPECT_FLOAT_EQ(w.grad().to_host()[0], 3.0f * 65536.0f);
  scaler.unscale_(sgd);  // the true gradient, for clipping
  EXPECT_FLOAT_EQ(w.grad().to_host()[0], 3.0f);
  EXPECT_FLOAT_EQ(w.grad().to_host()[1], 5.0f);
  EXPECT_THROW(scaler.unscale_(sgd), std::logic_error);  // once per step
  EXPECT_TRUE(scaler.step(sgd));
  EXPECT_FLOAT_EQ(w.to_host()[0], 1.0f - 0.1f * 3.0f);
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 65536.0f);  // one clean step is not growth_interval of them
  EXPECT_EQ(scaler.skipped_steps(), 0);
}

TEST(GradScaler, AStepWithAnInfOrNanIsSkippedAndTheScaleBacksOff) {
  for (float bad : {INFINITY, NAN}) {
    Tensor w = Tensor::from_host({1.0f, 1.0f}, {2}).set_requires_grad(true);
    optim::SGD sgd({w}, 0.1f);
    optim::GradScaler scaler;
    w.set_grad(Tensor::from_host({1.0f, bad}, {2}));
    EXPECT_FALSE(scaler.step(sgd));
    EXPECT_EQ(w.to_host(), (std::vector<float>{1.0f, 1.0f}));  // the parameters untouched
    scaler.update();
    EXPECT_EQ(scaler.get_scale(), 32768.0f);
    EXPECT_EQ(scaler.skipped_steps(), 1);
  }
}

TEST(GradScaler, TheScaleGrowsAfterGrowthIntervalCleanStepsInARow) {
  Tensor w = Tensor::from_host({1.0f}, {1}).set_requires_grad(true);
  optim::SGD sgd({w}, 1e-6f);
  optim::GradScaler scaler;
  for (int step = 0; step < 3999; ++step) {
    w.set_grad(Tensor::from_host({step == 1000 ? INFINITY : 1.0f}, {1}));
    scaler.step(sgd);
    scaler.update();
    if (step == 1000) {
      EXPECT_EQ(scaler.get_scale(), 32768.0f);  // backed off, the count restarts
    } else if (step == 2999) {
      EXPECT_EQ(scaler.get_scale(), 32768.0f);  // 1999 clean steps since
    } else if (step == 3000) {
      EXPECT_EQ(scaler.get_scale(), 65536.0f);  // the 2000th
    }
  }
  optim::GradScaler off({.enabled = false});
  EXPECT_EQ(off.get_scale(), 1.0f);
  w.set_grad(Tensor::from_host({INFINITY}, {1}));
  EXPECT_TRUE(off.step(sgd));  // disabled: it always steps
}

// A float16 run with a loss scale far too large: the scaled gradients overflow float16's range (65504)
// and become inf when stored in 16 bits, as fp16 gradients would; the scaler skips those steps and
// halves the scale until they fit, and training then goes on and learns.
TEST(GradScaler, AFloat16RunWithATooLargeScaleSkipsStepsAndRecovers) {
  Tensor w = Tensor::zeros({4, 1}).set_requires_grad(true);
  Tensor x = Tensor::randn({64, 4}, 1), target = matmul(x, Tensor::from_host({1.0f, -2.0f, 0.5f, 3.0f}, {4, 1}));
  optim::SGD sgd({w}, 0.05f);
  optim::GradScaler scaler({.init_scale = 16777216.0f});  // 2^24
  std::vector<std::uint16_t> half(4);
  float first = 0, last = 0;
  for (int step = 0; step < 200; ++step) {
    Tensor loss = mse_loss(matmul(x, w), target);
    if (step == 0) first = loss.item();
    last = loss.item();
    scaler.scale(loss).backward();
    Tensor g = w.grad();  // stored in float16, as a float16 model's gradient is
    kernels(Device::cpu).to_half(HalfFormat::float16, g.data(), half.data(), 4);
    kernels(Device::cpu).from_half(HalfFormat::float16, half.data(), g.data(), 4);
    scaler.step(sgd);
    scaler.update();
    sgd.zero_grad();
  }
  EXPECT_GT(scaler.skipped_steps(), 0);
  EXPECT_LT(scaler.skipped_steps(), 24);    // each skip halves the scale: it fits long before 2^0
  EXPECT_LT(scaler.get_scale(), 16777216.0f);
  EXPECT_LT(last, 1e-3f * first) << "after the skipped steps it trains";
}

}  // namespace
}  // namespace course
