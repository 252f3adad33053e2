// The addition task and generation: problems are distinct and the held-out set is disjoint, targets
// cover the answer alone, greedy generation is deterministic, and a fixed-seed GPT learns to add.
#include "common/data/addition.h"

#include <gtest/gtest.h>

#include <chrono>
#include <set>

#include "common/nn/generate.h"
#include "common/ops/autocast.h"
#include "common/optim/grad_scaler.h"
#include "common/optim/lr_scheduler.h"
#include "common/optim/optimizer.h"

namespace course::testing {
namespace {

TEST(Addition, ProblemsAreDistinctAndTheTestSetIsHeldOut) {
  data::AdditionTask task(2, 3000, 500, 7);
  std::set<std::pair<std::int64_t, std::int64_t>> train, test;
  for (const auto& p : task.train()) train.insert({p.a, p.b});
  for (const auto& p : task.test()) test.insert({p.a, p.b});
  EXPECT_EQ(train.size(), 3000u);
  EXPECT_EQ(test.size(), 500u);
  for (const auto& p : test) EXPECT_EQ(train.count(p), 0u);
  EXPECT_EQ(task.text({12, 45}), "12+45=750");  // 57, reversed and padded to 3 digits
  EXPECT_EQ(task.text({99, 99}), "99+99=891");
  EXPECT_THROW(data::AdditionTask(2, 6000, 0, 1), UsageError);  // more than half of the 10^4 problems
  EXPECT_THROW(data::AdditionTask(0, 10, 0, 1), UsageError);
}

TEST(Addition, OnlyTheAnswerIsATarget) {
  data::AdditionTask task(2, 10, 0, 3);
  auto batch = task.batch({0}, Device::cpu);
  const auto ids = batch.ids.to_host(), targets = batch.targets.to_host();
  const auto all = task.tokens(task.text(task.train()[0]));
  ASSERT_EQ(ids.size(), 8u);
  for (std::size_t j = 0; j < 8; ++j) {
    EXPECT_EQ(ids[j], all[j]);
    EXPECT_EQ(targets[j], j + 1 >= 6 ? all[j + 1] : -100.0f) << j;  // "ab+cd=" is 6 tokens
  }
}

TEST(Addition, GreedyGenerationIsRepeatable) {
  nn::GPTConfig c;
  c.vocab_size = 12;
  c.block_size = 8;
  nn::GPT gpt(c, Device::cpu, 1);
  data::AdditionTask task(2, 10, 4, 3);
  Tensor prompts = task.prompts(task.test(), Device::cpu);
  auto a = nn::generate(gpt, prompts, 3).to_host(), b = nn::generate(gpt, prompts, 3).to_host();
  EXPECT_EQ(a, b);
  EXPECT_EQ(a.size(), 4u * 9u);
  auto sampled = nn::generate(gpt, prompts, 3, {1.0f, 5, 9}).to_host();
  for (float id : sampled) EXPECT_TRUE(id >= 0 && id < 12);
}

// Two-digit addition, a 2-layer GPT of width 64, 1200 steps of 64 problems, AdamW with warm-up and cosine
// decay, in `precision` (float32, or mixed precision: float32 masters, the forward under autocast, and for
// float16 the recipe's loss scaling). Returns the held-out exact match.
double train_addition(DType precision) {
  data::AdditionTask task(2, 4000, 500, 11);
  nn::GPTConfig c;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_embd = 64;
  c.block_size = task.sequence_length();
  c.vocab_size = task.vocab_size();
  nn::GPT gpt(c, Device::cpu, 5);
  optim::Adam adamw(optim::weight_decay_groups(gpt.parameters(), 0.1f), 6e-3f, 0.9f, 0.95f, 1e-8f, true);
  optim::GradScalerOptions scaling;
  scaling.enabled = precision == DType::float16;
  optim::GradScaler scaler(scaling);
  const int steps = 1200;
  auto schedule = optim::warmup_cosine(6e-3f, 50, steps, 6e-4f);
  const auto begin = std::chrono::steady_clock::now();
  float loss_value = 0;
  for (int step = 0; step < steps; ++step) {
    std::vector<std::int64_t> indices;
    for (std::int64_t i = 0; i < 64; ++i) indices.push_back((step * 64 + i) % 4000);
    auto batch = task.batch(indices, Device::cpu);
    Tensor loss;
    {
      Autocast autocast(precision, precision != DType::float32);
      loss = cross_entropy(gpt(batch.ids), batch.targets);
    }
    loss_value = loss.item();
    scaler.scale(loss).backward();
    scaler.unscale_(adamw);
    if (!scaler.found_inf()) optim::clip_grad_norm_(gpt.parameters(), 1.0);
    adamw.set_lr(schedule->lr_at(step));
    scaler.step(adamw);
    scaler.update();
    adamw.zero_grad();
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
  const double accuracy = nn::addition_accuracy(gpt, task, task.test(), Device::cpu);
  std::printf("addition in %s: final loss %.4f, held-out exact match %.3f, %.1f s, %lld steps skipped\n",
              dtype_name(precision), loss_value, accuracy, seconds, static_cast<long long>(scaler.skipped_steps()));
  return accuracy;
}

// It reaches 100% exact match on 500 held-out problems (about 6 s on 2 cores), as do the initial seeds 6
// and 7. At 700 steps the run is still in its jump (seeds 5, 6, 7 gave 78%, 92% and 99%, and a change of
// rounding moves it), so the run goes on well past it. Chance is 1 in 1000 answers; 90% leaves room for
// another BLAS's rounding, while a broken model, mask or target stays far below it.
constexpr double kRequiredAccuracy = 0.90;

TEST(Addition, AFixedSeedGptLearnsToAdd) { EXPECT_GE(train_addition(DType::float32), kRequiredAccuracy); }

// Mixed precision learns it as well: the same accuracy is required of bfloat16 (no loss scaling needed:
// float32's range). float16 with dynamic loss scaling reaches 1.000 too (measured; its scaler's skip and
// recovery are tested in optim_test and chapter04_test).
TEST(Addition, MixedPrecisionLearnsToAddAsWell) { EXPECT_GE(train_addition(DType::bfloat16), kRequiredAccuracy); }

}  // namespace
}  // namespace course::testing
