// A training step waits for the device once: when the host reads the loss. Forward, backward, clipping
// and AdamW read nothing back and write nothing in (the positions, dropout's masks, the index checks, the
// cross-entropy's divisor and the clipping factor are all made where the model is), in fp32 and bf16,
// with dropout and clipping. Counted on the CPU (common/tensor/tensor.h, HostTransfers), so CI sees what
// a GPU would wait for; on a GPU, the deferred index checks raise at the host's next read.
#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>

#include "common/core/device.h"
#include "common/nn/gpt.h"
#include "common/ops/autocast.h"
#include "common/ops/ops.h"
#include "common/optim/optimizer.h"
#include "common/optim/recipe.h"

namespace course::testing {
namespace {

struct Counts {
  std::int64_t reads, writes, synchronizations;
};

Counts since(const HostTransfers& before) {
  const HostTransfers now = host_transfers();
  return {now.reads - before.reads, now.writes - before.writes, now.synchronizations - before.synchronizations};
}

// nanoGPT's step: the loss under autocast, its value read (the one read), backward, clip to norm 1, AdamW.
void train_step(nn::GPT& gpt, optim::Optimizer& optimizer, const Tensor& ids, const Tensor& targets, DType precision,
                float* loss_value) {
  Tensor loss;
  {
    Autocast autocast(precision);
    loss = cross_entropy(gpt(ids), targets);
  }
  *loss_value = loss.item();
  loss.backward();
  optim::clip_grad_norm_(gpt.parameters(), 1.0);
  optimizer.step();
  optimizer.zero_grad();
}

void expect_one_read_per_step(Device device) {
  for (const DType precision : {DType::float32, DType::bfloat16}) {
    nn::GPTConfig config;
    config.n_layer = 2, config.n_head = 2, config.n_embd = 32, config.block_size = 16, config.vocab_size = 11;
    config.dropout = 0.1f;
    nn::GPT gpt(config, device, 3);
    optim::Adam adamw(optim::weight_decay_groups(gpt.parameters(), 0.1f), 1e-3f, 0.9f, 0.95f, 1e-8f, true);
    std::vector<float> ids(4 * 16), targets(4 * 16);
    for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<float>(i * 7 % 11), targets[i] = static_cast<float>(i * 5 % 11);
    targets[3] = -100;  // one ignored row: the divisor is counted on the device
    const Tensor x = Tensor::from_host(ids, {4, 16}, device), y = Tensor::from_host(targets, {64}, device);
    float loss = 0;
    train_step(gpt, adamw, x, y, precision, &loss);  // the optimizer's state is made at its first step
    for (int step = 0; step < 3; ++step) {
      const HostTransfers before = host_transfers();
      train_step(gpt, adamw, x, y, precision, &loss);
      const Counts counts = since(before);
      EXPECT_EQ(counts.reads, 1) << dtype_name(precision) << " step " << step << ": only the loss is read";
      EXPECT_EQ(counts.writes, 0) << dtype_name(precision) << " step " << step;
      EXPECT_EQ(counts.synchronizations, 0) << dtype_name(precision) << " step " << step;
      EXPECT_TRUE(std::isfinite(loss));
    }
  }
}

TEST(HostTransfers, AGptTrainingStepReadsOnlyItsLoss) { expect_one_read_per_step(Device::cpu); }

// The chapters' step, through a recipe (GPT-2's AdamW, its schedule, clipping): the loss is read, the norm
// is not; in fp16 the overflow check is read once more, once for all the gradients (as torch.amp's).
TEST(HostTransfers, ARecipeStepReadsItsLossAndInFp16ItsOverflowCheckOnce) {
  for (const DType precision : {DType::float32, DType::bfloat16, DType::float16}) {
    nn::GPTConfig config;
    config.n_layer = 2, config.n_head = 2, config.n_embd = 32, config.block_size = 16, config.vocab_size = 11;
    nn::GPT gpt(config, Device::cpu, 3);
    optim::Recipe recipe(gpt.parameters(), {.name = "adamw", .lr = 1e-3f, .total_steps = 100, .precision = precision});
    std::vector<float> ids(64), targets(64);
    for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<float>(i * 7 % 11), targets[i] = static_cast<float>(i * 5 % 11);
    const Tensor x = Tensor::from_host(ids, {4, 16}), y = Tensor::from_host(targets, {64});
    for (int step = 0; step < 3; ++step) {
      const HostTransfers before = host_transfers();
      Tensor loss;
      {
        Autocast autocast(precision);
        loss = cross_entropy(gpt(x), y);
      }
      EXPECT_TRUE(std::isfinite(loss.item()));
      recipe.scale_loss(loss).backward();
      const Tensor norm = recipe.step(step);
      const Counts counts = since(before);
      EXPECT_EQ(counts.reads, precision == DType::float16 ? 2 : 1) << dtype_name(precision) << " step " << step;
      EXPECT_EQ(counts.writes, 0) << dtype_name(precision) << " step " << step;
      EXPECT_TRUE(norm.defined() || recipe.skipped()) << "adamw clips";
      EXPECT_GT(optim::norm_value(norm), 0.0);
    }
  }
}

// The counter counts: a read, a write, a copy each way.
TEST(HostTransfers, ReadsAndWritesAreCounted) {
  const HostTransfers before = host_transfers();
  Tensor t = Tensor::from_host({1, 2, 3}, {3});
  (void)t.to_host();
  (void)sum(t).item();
  const Counts counts = since(before);
  EXPECT_EQ(counts.reads, 2);
  EXPECT_EQ(counts.writes, 1);
}

// Clipping's norm stays where the gradients are and is what the host would compute from them.
TEST(HostTransfers, ClippingReturnsTheNormWhereTheGradientsAre) {
  Tensor a = Tensor::from_host({3, 0}, {2}).set_requires_grad(true), b = Tensor::from_host({4}, {1}).set_requires_grad(true);
  a.set_grad(Tensor::from_host({3, 0}, {2}));
  b.set_grad(Tensor::from_host({4}, {1}));
  const HostTransfers before = host_transfers();
  Tensor norm = optim::clip_grad_norm_({a, b}, 1.0);
  EXPECT_EQ(since(before).reads, 0);
  EXPECT_EQ(norm.device(), Device::cpu);
  EXPECT_EQ(norm.item(), 5.0f);
  const float factor = static_cast<float>(1.0 / (5.0 + 1e-6));  // max_norm / (norm + 1e-6), rounded once
  EXPECT_EQ(a.grad().to_host(), (std::vector<float>{3 * factor, 0}));
  EXPECT_EQ(b.grad().to_host(), (std::vector<float>{4 * factor}));
}

TEST(HostTransfers, RunsOnTheGpuOneReadPerStep) {
  std::string reason;
  if (!cuda_usable(&reason)) GTEST_SKIP() << "no usable GPU: " << reason;
  expect_one_read_per_step(Device::cuda);
}

// On a GPU a bad index is found by the kernel and raised at the host's next read, with the CPU's words.
TEST(HostTransfers, RunsOnTheGpuABadIndexIsRaisedAtTheNextRead) {
  std::string reason;
  if (!cuda_usable(&reason)) GTEST_SKIP() << "no usable GPU: " << reason;
  Tensor table = Tensor::randn({5, 4}, 1, Device::cuda);
  Tensor out = embedding(Tensor::from_host({1, 7, 2}, {3}, Device::cuda), table);  // no wait, no throw yet
  try {
    (void)sum(out).item();
    FAIL() << "the bad index was never raised";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), index_check_message(IndexCheck::embedding_index, 7.0f, 5).c_str());
  }
  EXPECT_NO_THROW((void)sum(out).item());  // raised once, then cleared
  Tensor logits = Tensor::randn({2, 3}, 2, Device::cuda);
  EXPECT_THROW((void)cross_entropy(logits, Tensor::from_host({-100, -100}, {2}, Device::cuda)).item(),
               std::invalid_argument);
  EXPECT_THROW((void)cross_entropy(logits, Tensor::from_host({0, 3}, {2}, Device::cuda)).item(), std::invalid_argument);
}

// The CPU raises at once, with the same words.
TEST(HostTransfers, OnTheCpuABadIndexIsRaisedAtOnce) {
  Tensor table = Tensor::randn({5, 4}, 1);
  try {
    (void)embedding(Tensor::from_host({1, 7, 2}, {3}), table);
    FAIL() << "the bad index was not raised";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "embedding: index 7.000000 is not a row below 5");
  }
  EXPECT_THROW((void)cross_entropy(Tensor::randn({2, 3}, 2), Tensor::from_host({-100, -100}, {2})), std::invalid_argument);
}

}  // namespace
}  // namespace course::testing
