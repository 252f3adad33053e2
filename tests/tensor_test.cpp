// Tensor creation, views, copies, seeded randomness and exact memory accounting.
#include <gtest/gtest.h>

#include <cmath>

#include "common/core/memory.h"
#include "common/tensor/tensor.h"

namespace course {
namespace {

TEST(Tensor, CreationFunctions) {
  EXPECT_EQ(Tensor::zeros({2, 3}).to_host(), std::vector<float>(6, 0.0f));
  EXPECT_EQ(Tensor::ones({4}).to_host(), std::vector<float>(4, 1.0f));
  EXPECT_EQ(Tensor::full({2}, 2.5f).to_host(), (std::vector<float>{2.5f, 2.5f}));
  Tensor t = Tensor::from_host({1, 2, 3, 4, 5, 6}, {2, 3});
  EXPECT_EQ(t.shape(), (Shape{2, 3}));
  EXPECT_EQ(t.numel(), 6);
  EXPECT_EQ(t.dim(-1), 3);
  EXPECT_FLOAT_EQ(Tensor::from_host({7}, {1}).item(), 7.0f);
  EXPECT_THROW(Tensor::from_host({1, 2}, {3}), std::invalid_argument);
  EXPECT_THROW(t.item(), std::invalid_argument);
}

TEST(Tensor, ViewsShareStorage) {
  Tensor t = Tensor::zeros({6});
  Tensor v = t.flat_view(2, 3);
  v.fill_(1.0f);
  EXPECT_EQ(t.to_host(), (std::vector<float>{0, 0, 1, 1, 1, 0}));
  EXPECT_THROW(t.flat_view(4, 3), std::out_of_range);
  Tensor c = t.clone();
  c.fill_(5.0f);
  EXPECT_EQ(t.to_host()[0], 0.0f);
}

TEST(Tensor, SeededRandomIsReproducibleAndWellDistributed) {
  auto a = Tensor::randn({20000}, 123).to_host();
  EXPECT_EQ(a, Tensor::randn({20000}, 123).to_host());
  EXPECT_NE(a, Tensor::randn({20000}, 124).to_host());
  double mean = 0, sq = 0;
  for (float x : a) mean += x;
  mean /= a.size();
  for (float x : a) sq += (x - mean) * (x - mean);
  EXPECT_NEAR(mean, 0.0, 0.03);
  EXPECT_NEAR(std::sqrt(sq / a.size()), 1.0, 0.03);
  for (float x : Tensor::rand_uniform({1000}, 1, -2.0f, 3.0f).to_host()) {
    EXPECT_GE(x, -2.0f);
    EXPECT_LT(x, 3.0f);
  }
}

TEST(Memory, CountsExactBytesPerCategory) {
  const auto before = memory_stats(Device::cpu);
  {
    MemoryCategoryScope scope(MemoryCategory::optimizer_state);
    Tensor t = Tensor::zeros({1000});
    auto during = memory_stats(Device::cpu);
    EXPECT_EQ(during.current_of(MemoryCategory::optimizer_state) - before.current_of(MemoryCategory::optimizer_state), 4000);
    EXPECT_EQ(during.current_total - before.current_total, 4000);
    Tensor view = t.flat_view(10, 10);  // a view allocates nothing
    EXPECT_EQ(memory_stats(Device::cpu).current_total, during.current_total);
  }
  const auto after = memory_stats(Device::cpu);
  EXPECT_EQ(after.current_total, before.current_total);
  EXPECT_GE(after.peak_of(MemoryCategory::optimizer_state), 4000);
  reset_peak_memory(Device::cpu);
  EXPECT_EQ(memory_stats(Device::cpu).peak_total, memory_stats(Device::cpu).current_total);
  Tensor activation = Tensor::zeros({10});  // outside any scope: an activation
  EXPECT_EQ(memory_stats(Device::cpu).current_of(MemoryCategory::activations) -
                after.current_of(MemoryCategory::activations), 40);
}

TEST(Device, SelectionRejectsUnknownNames) {
  EXPECT_EQ(select_device("cpu"), Device::cpu);
  EXPECT_THROW(select_device("tpu"), UsageError);
  std::string reason;
  if (!cuda_usable(&reason)) {
    EXPECT_THROW(select_device("cuda"), UsageError);
    EXPECT_EQ(select_device("auto", 0, false), Device::cpu);
    EXPECT_FALSE(reason.empty());
  }
}

}  // namespace
}  // namespace course
