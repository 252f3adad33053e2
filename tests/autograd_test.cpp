// The backward engine: accumulation into .grad, zero_grad, no_grad, shared inputs, post-accumulate
// hooks, end-of-backward callbacks, backward from a non-scalar output with a given gradient, and a
// backward split into its activations' half and its weights' half (zero bubble's B and W).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>

#include "common/autograd/autograd.h"
#include "common/autograd/profiler.h"
#include "common/nn/layers.h"
#include "common/ops/autocast.h"
#include "common/ops/ops.h"
#include "common/optim/grad_scaler.h"
#include "common/verify/contribution_magnitudes.h"

namespace course {
namespace {

TEST(Autograd, GradientsAccumulateUntilZeroGrad) {
  Tensor x = Tensor::from_host({3}, {1}).set_requires_grad(true);
  mul(x, x).backward();  // d(x^2)/dx = 2x = 6
  EXPECT_FLOAT_EQ(x.grad().item(), 6.0f);
  mul(x, x).backward();
  EXPECT_FLOAT_EQ(x.grad().item(), 12.0f);
  x.zero_grad();
  EXPECT_FLOAT_EQ(x.grad().item(), 0.0f);
}

TEST(Autograd, InputUsedManyTimesSumsItsContributions) {
  Tensor x = Tensor::from_host({2}, {1}).set_requires_grad(true);
  Tensor y = add(mul(x, x), mul(scale(x, 3.0f), x));  // 4 x^2 -> 8x = 16
  y.backward();
  EXPECT_FLOAT_EQ(x.grad().item(), 16.0f);
}

TEST(Autograd, NoGradRecordsNothing) {
  Tensor x = Tensor::from_host({2}, {1}).set_requires_grad(true);
  autograd::NoGradGuard guard;
  Tensor y = mul(x, x);
  EXPECT_FALSE(y.requires_grad());
  EXPECT_THROW(y.backward(), std::invalid_argument);
}

TEST(Autograd, BackwardNeedsAScalar) {
  Tensor x = Tensor::ones({3}).set_requires_grad(true);
  EXPECT_THROW(scale(x, 2.0f).backward(), std::invalid_argument);
}

TEST(Autograd, GradReadyHookFiresOncePerPassWhenComplete) {
  // w is read by two ops; its hook must fire once, after both contributions are in.
  Tensor w = Tensor::from_host({1, 2}, {2}).set_requires_grad(true);
  Tensor v = Tensor::from_host({5, 5}, {2}).set_requires_grad(true);
  std::vector<std::string> fired;
  std::vector<float> seen;
  w.register_post_accumulate_grad_hook([&](Tensor& p) {
    fired.push_back("w");
    seen = p.grad().to_host();
  });
  v.register_post_accumulate_grad_hook([&](Tensor&) { fired.push_back("v"); });
  Tensor loss = sum(add(mul(w, v), mul(w, w)));  // d/dw = v + 2w = (7, 9)
  loss.backward();
  EXPECT_EQ(std::count(fired.begin(), fired.end(), "w"), 1);
  EXPECT_EQ(std::count(fired.begin(), fired.end(), "v"), 1);
  EXPECT_EQ(seen, (std::vector<float>{7, 9}));
  sum(mul(w, v)).backward();
  EXPECT_EQ(std::count(fired.begin(), fired.end(), "w"), 2);
}

TEST(Autograd, HooksFireInReverseLayerOrderForAnMlp) {
  // The last layer's gradients are ready first: chapter 05 buckets parameters in this order.
  auto mlp = nn::make_mlp(4, 8, 2, 1, nn::Activation::relu, Device::cpu, 1);
  std::vector<std::string> order;
  for (auto& [name, p] : mlp->named_parameters()) {
    std::string n = name;
    p.register_post_accumulate_grad_hook([&order, n](Tensor&) { order.push_back(n); });
  }
  Tensor x = Tensor::randn({3, 4}, 2), y = Tensor::randn({3, 1}, 3);
  mse_loss((*mlp)(x), y).backward();
  ASSERT_EQ(order.size(), 6u);
  EXPECT_EQ(order.front().substr(0, 2), "4.");  // the output layer
  EXPECT_EQ(order.back().substr(0, 2), "0.");   // the first layer
}

TEST(Autograd, GraphIsFreedAfterBackward) {
  Tensor x = Tensor::ones({100}).set_requires_grad(true);
  const auto before = memory_stats(Device::cpu).current_of(MemoryCategory::activations);
  {
    Tensor loss = sum(relu(scale(x, 2.0f)));
    loss.backward();
  }
  EXPECT_EQ(memory_stats(Device::cpu).current_of(MemoryCategory::activations), before);
}

// The graph keeps what each op's backward saved, not the values of every tensor it read: an
// intermediate that no op saved (a cast's float32 source, an addition's operands) is freed as soon as
// the forward drops it, and its gradient still flows through it.
TEST(Autograd, AGraphKeepsWhatBackwardNeedsNotEveryInput) {
  Tensor x = Tensor::ones({1000}).set_requires_grad(true);
  const auto activations = [] { return memory_stats(Device::cpu).current_of(MemoryCategory::activations); };
  const auto before = activations();
  Tensor narrow;
  {
    Tensor doubled = scale(x, 2.0f);               // 4000 bytes, saved by nothing that follows
    narrow = cast(add(doubled, doubled), DType::bfloat16);  // add keeps shapes only; cast keeps its type
  }
  EXPECT_EQ(activations() - before, 2000);  // only the 16-bit result is alive
  sum(narrow).backward();
  EXPECT_EQ(x.grad().to_host(), std::vector<float>(1000, 4.0f));
}

// Backward frees each node's saved tensors as it passes it; a second backward through the freed graph
// says what happened instead of reading freed memory.
TEST(Autograd, ASecondBackwardThroughAFreedGraphIsNamed) {
  Tensor x = Tensor::ones({4}).set_requires_grad(true);
  Tensor y = relu(scale(x, 3.0f));
  Tensor loss = sum(y);
  loss.backward();
  try {
    sum(y).backward();
    FAIL() << "backward through a freed graph ran";
  } catch (const std::logic_error& e) {
    EXPECT_NE(std::string(e.what()).find("a second time"), std::string::npos) << e.what();
  }
}

// A lock-step check's record of a leaf's terms: a weight used twice gets two contributions, their
// absolute values added (where their sum cancels, the record does not), and the loss scale's undoing
// reaches the record as it reaches the gradient.
TEST(Autograd, ContributionMagnitudesCountEveryTermOfALeafsGradient) {
  Tensor w = Tensor::from_host({3.0f, -1.0f}, {2}).set_requires_grad(true);
  const Tensor a = Tensor::from_host({1.0f, 2.0f}, {2}), b = Tensor::from_host({-1.0f, 0.5f}, {2});
  verify::ContributionMagnitudes terms;
  sum(add(mul(w, a), mul(w, b))).backward();
  EXPECT_EQ(w.grad().to_host(), (std::vector<float>{0.0f, 2.5f}));
  ASSERT_NE(terms.of(w), nullptr);
  EXPECT_EQ(*terms.of(w), (std::vector<double>{2.0, 2.5}));
  EXPECT_EQ(terms.most_contributions(), 2);
  optim::GradScalerOptions options;
  options.init_scale = 4.0f;
  optim::GradScaler(options).unscale_gradients({w});
  EXPECT_EQ(w.grad().to_host(), (std::vector<float>{0.0f, 0.625f}));
  EXPECT_EQ(*terms.of(w), (std::vector<double>{0.5, 0.625}));
  EXPECT_EQ(terms.of(a), nullptr);  // no gradient, no record
}

TEST(Autograd, HookNamesTheParameterAndCallbacksRunWhenBackwardEnds) {
  Tensor w = Tensor::from_host({1, 2}, {2}).set_requires_grad(true);
  Tensor v = Tensor::from_host({3, 4}, {2}).set_requires_grad(true);
  std::vector<std::string> events;
  for (auto [name, t] : {std::pair<const char*, Tensor*>{"w", &w}, {"v", &v}}) {
    std::string n = name;
    TensorImpl* expected = t->impl();
    t->register_post_accumulate_grad_hook([&events, n, expected](Tensor& p) {
      EXPECT_EQ(p.impl(), expected);  // the hook is handed its own parameter
      events.push_back("hook " + n);
      if (n == "w") autograd::queue_callback([&events] { events.push_back("end"); });
    });
  }
  sum(mul(w, v)).backward();
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events.back(), "end");  // after every hook of the pass
  EXPECT_EQ(std::count(events.begin(), events.end(), "end"), 1);
  EXPECT_THROW(autograd::queue_callback([] {}), std::logic_error);  // no backward is running
}

// The op profiler: each primitive op's forward and backward counted once under its name, the ops run
// inside another op's scope (matmul's backward runs two matmuls) not counted again, nothing recorded
// without a Profile.
TEST(Profiler, CountsEachOpsForwardAndBackwardOnce) {
  Tensor w = Tensor::randn({3, 4}, 1).set_requires_grad(true);
  Tensor x = Tensor::randn({2, 4}, 2);
  sum(matmul(x, w, false, true)).backward();  // before the profile: not counted
  autograd::profiler::Profile profile(Device::cpu);
  sum(matmul(x, w, false, true)).backward();
  const auto table = profile.table();
  auto find = [&](const std::string& name) {
    auto it = std::find_if(table.begin(), table.end(), [&](const auto& op) { return op.name == name; });
    return it == table.end() ? autograd::profiler::OpTime{} : *it;
  };
  EXPECT_EQ(find("matmul").forward_calls, 1);
  EXPECT_EQ(find("matmul").backward_calls, 1);  // its two GEMMs inside are the backward's own time
  EXPECT_EQ(find("sum").forward_calls, 1);
  EXPECT_EQ(find("sum").backward_calls, 1);
  EXPECT_EQ(table.size(), 2u);
  for (const auto& op : table) EXPECT_GE(op.forward_ms + op.backward_ms, 0.0) << op.name;
  profile.reset();
  EXPECT_TRUE(profile.table().empty());
}

TEST(Autograd, BackwardFromANonScalarOutputWithItsGradient) {
  // A pipeline stage: y = x W^T arrives with dL/dy from the next stage; the result must equal
  // backward of sum(y * g), whose gradient with respect to y is g.
  Tensor w1 = Tensor::randn({3, 4}, 1).set_requires_grad(true), w2 = Tensor::randn({3, 4}, 1).set_requires_grad(true);
  Tensor x = Tensor::randn({2, 4}, 2), g = Tensor::randn({2, 3}, 3);
  matmul(x, w1, false, true).backward(g);
  sum(mul(matmul(x, w2, false, true), g)).backward();
  auto a = w1.grad().to_host(), b = w2.grad().to_host();
  for (std::size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-5f) << i;
  EXPECT_THROW(matmul(x, w1, false, true).backward(Tensor::zeros({3, 2})), std::invalid_argument);
  EXPECT_THROW(matmul(x, w1, false, true).backward(), std::invalid_argument);  // not a loss, no gradient given
}

// Zero bubble's split (autograd::backward_deferring_weights): two linear layers (one without a bias)
// and a tied head (matmul with the table second), in float32 and under bfloat16 autocast. After B the
// input has its gradient and no weight has one; after W every gradient is the one backward's, bit for
// bit, accumulated over two micro-batches as one backward per micro-batch would.
TEST(Autograd, DeferringTheWeightsGivesOneBackwardsGradientsBitForBit) {
  for (const DType precision : {DType::float32, DType::bfloat16}) {
    struct Net {
      Tensor w1 = Tensor::randn({6, 5}, 1).set_requires_grad(true), b1 = Tensor::randn({6}, 2).set_requires_grad(true);
      Tensor w2 = Tensor::randn({4, 6}, 3).set_requires_grad(true), table = Tensor::randn({7, 4}, 4).set_requires_grad(true);
      std::vector<Tensor> weights() const { return {w1, b1, w2, table}; }
    };
    const auto loss_of = [precision](const Net& n, const Tensor& x) {
      Autocast autocast(precision, precision != DType::float32);
      Tensor h = gelu(linear(x, n.w1, n.b1));
      Tensor logits = matmul(linear(h, n.w2, Tensor()), n.table, false, true);
      return sum(mul(logits, logits));
    };
    Net whole, split;
    std::vector<Tensor> x_whole, x_split;
    for (int i = 0; i < 2; ++i) {
      const Tensor x = Tensor::randn({3, 5}, 10 + static_cast<std::uint64_t>(i));
      x_whole.push_back(x.clone().set_requires_grad(true));
      x_split.push_back(x.clone().set_requires_grad(true));
      loss_of(whole, x_whole.back()).backward();
    }
    std::vector<autograd::DeferredWeightGradients> later;
    for (int i = 0; i < 2; ++i) {
      later.push_back(autograd::backward_deferring_weights(loss_of(split, x_split[static_cast<std::size_t>(i)])));
      EXPECT_FALSE(later.back().empty());
      EXPECT_TRUE(x_split[static_cast<std::size_t>(i)].grad().defined()) << "B computes the input's gradient";
    }
    for (const Tensor& w : split.weights()) EXPECT_FALSE(w.grad().defined()) << "B leaves every weight's for W";
    for (auto& w : later) w.run();
    const auto a = whole.weights(), b = split.weights();
    for (std::size_t k = 0; k < a.size(); ++k) {
      ASSERT_TRUE(b[k].grad().defined()) << k;
      const auto expected = a[k].grad().to_host(), got = b[k].grad().to_host();
      EXPECT_EQ(std::memcmp(expected.data(), got.data(), expected.size() * sizeof(float)), 0)
          << "weight " << k << " in " << dtype_name(precision);
    }
    for (int i = 0; i < 2; ++i) {
      const auto expected = x_whole[static_cast<std::size_t>(i)].grad().to_host(),
                 got = x_split[static_cast<std::size_t>(i)].grad().to_host();
      EXPECT_EQ(std::memcmp(expected.data(), got.data(), expected.size() * sizeof(float)), 0) << "input " << i;
    }
  }
}

}  // namespace
}  // namespace course
