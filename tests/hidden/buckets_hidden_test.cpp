// Exercise 05.1's hidden graded tests (run by `exercises.py grade`, kept out of the participant's copy):
// models far larger than the visible tests', caps of zero (every parameter alone) and caps above the whole
// model (one bucket), each against the library's assignment.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "05_bucketing_overlap/buckets.h"
#include "common/parallel/reducer.h"

namespace course::testing {
namespace {

TEST(Hidden05, BucketsMatchTheLibrarysOnLargeModelsAndExtremeCaps) {
  std::mt19937_64 random(505);
  for (int trial = 0; trial < 200; ++trial) {
    const std::size_t n = 1 + random() % 300;
    std::vector<std::size_t> bytes(n), order(n);
    std::size_t total = 0;
    for (std::size_t i = 0; i < n; ++i) {
      bytes[i] = random() % 7 == 0 ? 0 : 4 * (1 + random() % 250000);
      total += bytes[i];
      order[i] = n - 1 - i;
    }
    if (trial % 2) std::shuffle(order.begin(), order.end(), random);
    const std::size_t caps[][2] = {{0, 0}, {total, total}, {0, total / 4 + 1}, {random() % (total + 1), random() % (total + 1)}};
    for (const auto& cap : caps)
      EXPECT_EQ(chapter05::assign_buckets(order, bytes, cap[0], cap[1]),
                parallel::assign_buckets_by_size(order, bytes, cap[0], cap[1]))
          << "trial " << trial << ": " << n << " parameters, caps " << cap[0] << " and " << cap[1];
  }
}

}  // namespace
}  // namespace course::testing
