// DistributedSampler: disjoint, covering, epoch-dependent, equal shares; its state round-trips.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "common/data/sampling.h"
#include "common/parallel/distributed_sampler.h"

namespace course::parallel {
namespace {

std::vector<std::vector<std::int64_t>> shares(std::int64_t n, int ranks, std::uint64_t epoch, bool drop_last = false) {
  std::vector<std::vector<std::int64_t>> out;
  for (int r = 0; r < ranks; ++r) {
    DistributedSampler s(n, ranks, r, 7, true, drop_last);
    s.set_epoch(epoch);
    out.push_back(s.indices());
  }
  return out;
}

TEST(DistributedSampler, SharesAreDisjointAndCoverTheDataset) {
  for (int ranks : {1, 2, 3, 4}) {
    auto all = shares(1000, ranks, 0);  // 1000 divides by 1, 2, 4 but not 3: then padded by 2
    std::multiset<std::int64_t> seen;
    for (auto& s : all) {
      EXPECT_EQ(s.size(), all[0].size());
      seen.insert(s.begin(), s.end());
    }
    for (std::int64_t i = 0; i < 1000; ++i) EXPECT_GE(seen.count(i), 1u) << "index " << i << " with " << ranks << " ranks";
    EXPECT_EQ(seen.size(), static_cast<std::size_t>((1000 + ranks - 1) / ranks * ranks));  // only the padding repeats
  }
}

TEST(DistributedSampler, EveryRankGetsTheSameNumberOfSamples) {
  for (std::int64_t n : {1, 5, 999, 1001})
    for (int ranks : {2, 3, 4}) {
      auto padded = shares(std::max<std::int64_t>(n, ranks), ranks, 0);
      for (auto& s : padded) EXPECT_EQ(s.size(), padded[0].size());
      auto dropped = shares(std::max<std::int64_t>(n, ranks), ranks, 0, true);
      for (auto& s : dropped) EXPECT_EQ(static_cast<std::int64_t>(s.size()), std::max<std::int64_t>(n, ranks) / ranks);
      std::set<std::int64_t> unique;
      for (auto& s : dropped) unique.insert(s.begin(), s.end());
      EXPECT_EQ(unique.size(), dropped[0].size() * static_cast<std::size_t>(ranks));  // drop_last never repeats
    }
}

TEST(DistributedSampler, ShuffleDependsOnSeedAndEpoch) {
  EXPECT_NE(shares(100, 2, 0)[0], shares(100, 2, 1)[0]);
  EXPECT_EQ(shares(100, 2, 3)[1], shares(100, 2, 3)[1]);
  DistributedSampler other_seed(100, 2, 0, 8);
  EXPECT_NE(other_seed.indices(), shares(100, 2, 0)[0]);
  DistributedSampler ordered(10, 2, 1, 0, false);
  EXPECT_EQ(ordered.indices(), (std::vector<std::int64_t>{1, 3, 5, 7, 9}));
}

TEST(DistributedSampler, GlobalOrderInterleavesTheRanks) {
  DistributedSampler s0(11, 3, 0, 5), s2(11, 3, 2, 5);
  auto order = s0.global_order();
  ASSERT_EQ(order.size(), 12u);
  EXPECT_EQ(order[11], order[0]);  // padding wraps around
  EXPECT_EQ(s2.indices()[1], order[5]);
}

// The epoch's order is kept between steps (a shuffle of millions of windows per step was most of a
// character model's step): batches taken in any order of steps, across epochs and back, are the
// epoch's order sliced, the same as from a fresh sampler.
TEST(DistributedSampler, BatchesAcrossEpochsInAnyOrderAreTheirEpochsSlices) {
  const std::int64_t n = 10, local = 2;
  DistributedSampler kept(n, 2, 1, 3);
  for (std::int64_t step : {0, 4, 2, 5, 7, 1, 9, 0, 12, 3}) {
    DistributedSampler fresh(n, 2, 1, 3);
    const auto epoch = static_cast<std::uint64_t>(step / fresh.steps_per_epoch(local));
    fresh.set_epoch(epoch);
    const auto mine = fresh.indices();
    const std::int64_t begin = (step % fresh.steps_per_epoch(local)) * local;
    const std::vector<std::int64_t> expected(mine.begin() + begin,
                                             mine.begin() + std::min<std::int64_t>(begin + local, fresh.num_samples()));
    EXPECT_EQ(kept.batch(step, local), expected) << "step " << step;
  }
}

// One data order in the course: an epoch of the sampler is the sample stream's epoch (chapters 06 and 08
// read the stream by position), padded by wrapping to a multiple of the ranks.
TEST(DistributedSampler, AnEpochIsTheSampleStreamsEpochPadded) {
  const std::int64_t n = 103;
  const data::SampleStream stream(n, 7);
  for (std::uint64_t epoch : {0u, 1u, 5u}) {
    DistributedSampler sampler(n, 4, 0, 7);
    sampler.set_epoch(epoch);
    const auto order = sampler.global_order();
    const auto expected = stream.take(static_cast<std::int64_t>(epoch) * n, n);
    ASSERT_EQ(order.size(), 104u);
    EXPECT_TRUE(std::equal(expected.begin(), expected.end(), order.begin())) << "epoch " << epoch;
    EXPECT_EQ(order.back(), expected.front()) << "the padding wraps to the epoch's start";
  }
}

TEST(DistributedSampler, ARankOutsideTheReplicasIsRefused) {
  EXPECT_THROW(DistributedSampler(10, 2, 2), std::invalid_argument);
  EXPECT_THROW(DistributedSampler(10, 2, -1), std::invalid_argument);
}

}  // namespace
}  // namespace course::parallel
