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

// 16-bit storage: half the bytes, values rounded to nearest even once on the way in and widened exactly
// on the way out. The expected bits are the formats' own: 1/3 is 0x3EAB in bfloat16 (0.333984375) and
// 0x3555 in float16 (0.333251953125); 65520 overflows float16 to infinity, 1e-8 underflows it to 0.
TEST(Tensor, SixteenBitTypesStoreRoundedValues) {
  const std::vector<float> values{1.0f / 3.0f, -2.5f, 65520.0f, 1e-8f};
  Tensor bf = Tensor::from_host(values, {4}, Device::cpu, DType::bfloat16);
  Tensor hf = Tensor::from_host(values, {4}, Device::cpu, DType::float16);
  EXPECT_EQ(bf.dtype(), DType::bfloat16);
  EXPECT_EQ(bf.nbytes(), 8u);
  EXPECT_EQ(bf.data16()[0], 0x3EABu);
  EXPECT_EQ(hf.data16()[0], 0x3555u);
  EXPECT_EQ(bf.to_host()[0], 0.333984375f);
  EXPECT_EQ(hf.to_host()[0], 0.333251953125f);
  EXPECT_EQ(hf.to_host()[1], -2.5f);
  EXPECT_TRUE(std::isinf(hf.to_host()[2]));
  EXPECT_EQ(bf.to_host()[2], 65536.0f);  // bfloat16 keeps the range, loses the digits
  EXPECT_EQ(hf.to_host()[3], 0.0f);
  EXPECT_GT(bf.to_host()[3], 0.0f);
  // A 16-bit tensor's bits are never read as floats.
  EXPECT_THROW(bf.data(), std::logic_error);
  EXPECT_THROW(Tensor::zeros({2}).data16(), std::logic_error);
  // Conversions: to(dtype), between the 16-bit types, and copy_from across types.
  EXPECT_EQ(bf.to(DType::float32).dtype(), DType::float32);
  EXPECT_EQ(bf.to(DType::float16).to_host()[0], 0.333984375f);  // exactly a float16 too
  Tensor target = Tensor::zeros({4}, Device::cpu, DType::bfloat16);
  target.copy_from(Tensor::from_host(values, {4}));
  EXPECT_EQ(target.to_host(), bf.to_host());
  // Views, fill and clone keep the type; views count in elements of it.
  Tensor v = target.flat_view(1, 2);
  EXPECT_EQ(v.dtype(), DType::bfloat16);
  v.fill_(0.1f);
  EXPECT_EQ(target.to_host()[1], target.to_host()[2]);
  EXPECT_EQ(target.to_host()[1], 0.10009765625f);  // bfloat16's nearest to 0.1
  EXPECT_EQ(target.clone().to_host(), target.to_host());
  EXPECT_EQ(Tensor::ones({3}, Device::cpu, DType::float16).to_host(), std::vector<float>(3, 1.0f));
}

TEST(Memory, SixteenBitTensorsCountHalfTheBytes) {
  const auto before = memory_stats(Device::cpu).current_of(MemoryCategory::optimizer_state);
  {
    MemoryCategoryScope scope(MemoryCategory::optimizer_state);
    Tensor a = Tensor::empty({1000}, Device::cpu, DType::bfloat16);
    EXPECT_EQ(memory_stats(Device::cpu).current_of(MemoryCategory::optimizer_state) - before, 2000);
    Tensor f = a.to(DType::float16);
    EXPECT_EQ(memory_stats(Device::cpu).current_of(MemoryCategory::optimizer_state) - before, 4000);
  }
  EXPECT_EQ(memory_stats(Device::cpu).current_of(MemoryCategory::optimizer_state), before);
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
