// Exercise 05.1, chapter 05's bucket assignment (05_bucketing_overlap/buckets.cpp), held against hand-worked
// cases and against the library's own (parallel::assign_buckets_by_size) on many random ones.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "05_bucketing_overlap/buckets.h"
#include "common/parallel/reducer.h"

namespace course::testing {
namespace {

using Buckets = std::vector<std::vector<std::size_t>>;

// Five parameters of 100 bytes in reverse order; the first bucket holds 150 bytes, the later ones 250:
// 4 alone (4 and 3 would be 200 > 150), then 3 and 2 (300 > 250 with 1), then 1 and 0.
TEST(Exercise05, BucketsFillInTheGivenOrderUnderTheirCaps) {
  EXPECT_EQ(chapter05::assign_buckets({4, 3, 2, 1, 0}, {100, 100, 100, 100, 100}, 150, 250),
            (Buckets{{4}, {3, 2}, {1, 0}}));
}

// A bucket that reaches its cap exactly is full, not over: two 50-byte gradients share a 100-byte bucket.
TEST(Exercise05, BucketsMayReachTheirCapExactly) {
  EXPECT_EQ(chapter05::assign_buckets({2, 1, 0}, {50, 50, 50}, 100, 100), (Buckets{{2, 1}, {0}}));
}

// A parameter bigger than any cap gets a bucket of its own, and the next one starts another.
TEST(Exercise05, BucketsGiveAParameterBiggerThanTheCapItsOwn) {
  EXPECT_EQ(chapter05::assign_buckets({2, 1, 0}, {10, 1000, 10}, 100, 100), (Buckets{{2}, {1}, {0}}));
}

// After the first step the Reducer rebuilds in the order gradients arrived: the walk follows `order`,
// not the indices. Here the first cap (60) is smaller than the later ones (120).
TEST(Exercise05, BucketsFollowTheOrderGivenNotTheIndices) {
  EXPECT_EQ(chapter05::assign_buckets({1, 3, 0, 2}, {40, 40, 40, 40}, 60, 120), (Buckets{{1}, {3, 0, 2}}));
}

TEST(Exercise05, BucketsOfNoParametersAreNone) {
  EXPECT_TRUE(chapter05::assign_buckets({}, {}, 100, 100).empty());
}

// Random sizes (zero-sized parameters among them), orders and caps: the library's assignment, exactly.
TEST(Exercise05, BucketsMatchTheLibrarysOnRandomModels) {
  std::mt19937_64 random(5);
  for (int trial = 0; trial < 500; ++trial) {
    const std::size_t n = random() % 30;
    std::vector<std::size_t> bytes(n), order(n);
    for (std::size_t i = 0; i < n; ++i) {
      bytes[i] = random() % 5 == 0 ? 0 : 4 * (1 + random() % 400);
      order[i] = i;
    }
    std::shuffle(order.begin(), order.end(), random);
    const std::size_t first_cap = random() % 1200, cap = random() % 3000;
    EXPECT_EQ(chapter05::assign_buckets(order, bytes, first_cap, cap),
              parallel::assign_buckets_by_size(order, bytes, first_cap, cap))
        << "trial " << trial << ": " << n << " parameters, caps " << first_cap << " and " << cap;
  }
}

}  // namespace
}  // namespace course::testing
