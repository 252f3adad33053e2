// verify::check_data_order on groups of 3 and 4 threads: the shares as DistributedSampler lays them out
// pass; a sample taken twice (and so one never), one from outside the batch, shares in another order and
// shares that do not add up each fail with a line that names the sample and the ranks.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/verify/data_order.h"
#include "common/verify/local_group.h"

namespace course::verify {
namespace {

// Each rank's share of `global` as the ranks take turns (written out here, not DistributedSampler's),
// then `change` applied to them; what rank 0 of a group of `ranks` says.
std::string verdict(int ranks, const std::vector<std::int64_t>& global,
                    const std::function<void(std::vector<std::vector<std::int64_t>>&)>& change = {}) {
  std::vector<std::vector<std::int64_t>> shares(static_cast<std::size_t>(ranks));
  for (std::size_t i = 0; i < global.size(); ++i) shares[i % shares.size()].push_back(global[i]);
  if (change) change(shares);
  LocalGroup group(ranks);
  std::string said;
  group.run([&](comm::Communicator& c) {
    const std::string mine = check_data_order(c, shares[static_cast<std::size_t>(c.rank())], global);
    if (c.rank() == 0) said = mine;
    else EXPECT_EQ(mine, "") << "rank " << c.rank() << " speaks";
  });
  return said;
}

TEST(DataOrder, TheSamplersLayoutPasses) {
  EXPECT_EQ(verdict(3, {40, 7, 12, 99, 3, 58}), "");
  EXPECT_EQ(verdict(4, {40, 7, 12, 99, 3, 58, 71}), "");  // shares of 2, 2, 2 and 1
  EXPECT_EQ(verdict(3, {5, 5, 6}), "");                   // a padded epoch repeats a sample: as often as the batch
}

TEST(DataOrder, ASampleTakenTwiceIsNamedWithItsRanks) {
  // The last rank takes rank 0's first sample in place of its own: 99 twice, 58 never.
  const std::string said = verdict(3, {40, 7, 12, 99, 3, 58}, [](auto& s) { s[2][1] = s[0][0]; });
  EXPECT_EQ(said, "sample 40 of the global batch is taken 2 time(s) by rank 0, rank 2, not 1: the ranks' shares must "
                  "be the global batch exactly once");
  const std::string never = verdict(4, {1, 2, 3, 4, 5, 6, 7, 8}, [](auto& s) { s[3][1] = s[3][0]; });
  EXPECT_EQ(never, "sample 4 of the global batch is taken 2 time(s) by rank 3, rank 3, not 1: the ranks' shares must "
                   "be the global batch exactly once");
}

TEST(DataOrder, ASampleFromElsewhereTheOrderAndTheCountAreChecked) {
  EXPECT_EQ(verdict(3, {40, 7, 12, 99, 3, 58}, [](auto& s) { s[1][0] = 1000; }),
            "sample 7 of the global batch is taken 0 time(s), not 1: the ranks' shares must be the global batch exactly once");
  EXPECT_EQ(verdict(3, {40, 7, 12, 99, 3, 58}, [](auto& s) { std::swap(s[0][0], s[1][0]); }),
            "position 0 of the global batch (sample 40) is not rank 0's sample 0: the shares are out of the single-rank "
            "run's order");
  EXPECT_EQ(verdict(3, {40, 7, 12, 99, 3, 58}, [](auto& s) { s[2].push_back(1000); }),
            "rank 2 trains on sample 1000, which the global batch does not hold");
}

}  // namespace
}  // namespace course::verify
