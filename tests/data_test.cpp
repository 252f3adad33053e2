// The synthetic datasets, shuffling and batching.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

#include "common/data/house_prices.h"
#include "common/data/sampling.h"

namespace course::data {
namespace {

TEST(Data, HousePricesFollowTheirRule) {
  Dataset d = make_house_prices(500, 1, 0.0f);  // no noise: the rule holds exactly
  ASSERT_EQ(d.x.size(), 1000u);
  for (std::int64_t i = 0; i < d.size; ++i) {
    float bed = d.x[2 * i], bath = d.x[2 * i + 1];
    EXPECT_TRUE(bed >= 1 && bed <= 5 && bath >= 1 && bath <= 3);
    EXPECT_FLOAT_EQ(d.y[i], kTrueBedroomWeight * bed + kTrueBathroomWeight * bath + kTrueBias);
  }
  EXPECT_EQ(make_house_prices(50, 3).y, make_house_prices(50, 3).y);
  EXPECT_NE(make_house_prices(50, 3).y, make_house_prices(50, 4).y);
}

TEST(Data, WideDatasetHasItsFeatures) {
  Dataset d = make_house_prices_wide(100, 8, 2, 0.0f);
  EXPECT_EQ(d.features, 8);
  EXPECT_EQ(d.true_weights.size(), 8u);
  double price = d.true_bias + 0.5 * d.x[0] * d.x[1];
  for (int j = 0; j < 8; ++j) price += d.true_weights[j] * d.x[j];
  EXPECT_NEAR(d.y[0], price, 1e-4);
}

TEST(Data, ShuffleIsAPermutationThatDependsOnTheEpoch) {
  auto a = shuffled_indices(1000, 5, 0), b = shuffled_indices(1000, 5, 1);
  EXPECT_NE(a, b);
  EXPECT_EQ(a, shuffled_indices(1000, 5, 0));
  std::sort(a.begin(), a.end());
  std::vector<std::int64_t> all(1000);
  std::iota(all.begin(), all.end(), 0);
  EXPECT_EQ(a, all);
}

TEST(Data, SampleStreamContinuesAcrossEpochsAndChunks) {
  SampleStream stream(10, 7);
  // Position p is sample p % 10 of epoch p / 10's shuffle.
  auto epoch0 = shuffled_indices(10, 7, 0), epoch1 = shuffled_indices(10, 7, 1);
  std::vector<std::int64_t> expected(epoch0.begin() + 6, epoch0.end());
  expected.insert(expected.end(), epoch1.begin(), epoch1.begin() + 5);
  EXPECT_EQ(stream.take(6, 9), expected);
  EXPECT_EQ(stream.epoch_of(16), 1);
  // However it is cut into batches (any world size, any resume point), the stream is the same.
  auto whole = stream.take(3, 25);
  auto first = stream.take(3, 11), second = stream.take(14, 14);
  first.insert(first.end(), second.begin(), second.end());
  EXPECT_EQ(first, whole);
  EXPECT_EQ(SampleStream(10, 7).take(23, 5), stream.take(23, 5));  // a fresh stream: no hidden state
  EXPECT_THROW(SampleStream(0, 1), std::invalid_argument);
  EXPECT_THROW(stream.take(-1, 2), std::invalid_argument);
}

TEST(Data, BatchesKeepThePartialLastOne) {
  std::vector<std::int64_t> order(10);
  std::iota(order.begin(), order.end(), 0);
  auto batches = split_batches(order, 4);
  ASSERT_EQ(batches.size(), 3u);
  EXPECT_EQ(batches[2], (std::vector<std::int64_t>{8, 9}));
  Dataset d = make_house_prices(10, 1);
  Batch b = make_batch(d, batches[2], Device::cpu);
  EXPECT_EQ(b.x.shape(), (Shape{2, 2}));
  EXPECT_EQ(b.y.shape(), (Shape{2, 1}));
  EXPECT_FLOAT_EQ(b.y.to_host()[1], d.y[9]);
  EXPECT_THROW(split_batches(order, 0), std::invalid_argument);
}

}  // namespace
}  // namespace course::data
