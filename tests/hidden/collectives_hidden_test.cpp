// Chapter 03's hidden graded tests (kept out of the participant's copy, run by `exercises.py grade`): the
// three collectives at rank counts the visible tests do not use (4 and 6), called back to back with roots
// and sizes changing between calls, on chunks large enough to cross any small-buffer path, with values of
// both signs. Values are small integers in float: every sum is exact, results are compared exactly.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "03_collectives/collectives.h"
#include "support/mpi_main.h"

namespace course::testing {
namespace {

// Rank r's element i, for call k: in [-6, 6], so that sums over 6 ranks stay exact.
float value(int k, int rank, std::size_t i) {
  return static_cast<float>(static_cast<int>((static_cast<std::size_t>(k * 7 + rank * 31) + i) % 13) - 6);
}

Tensor rank_tensor(int k, std::size_t count, int rank) {
  std::vector<float> v(count);
  for (std::size_t i = 0; i < count; ++i) v[i] = value(k, rank, i);
  return Tensor::from_host(v, {static_cast<std::int64_t>(count)});
}

// The first element where `got` differs from `want(i)`, or -1.
template <typename Want>
long first_wrong(const std::vector<float>& got, std::size_t count, Want want) {
  for (std::size_t i = 0; i < count; ++i)
    if (got[i] != want(i)) return static_cast<long>(i);
  return -1;
}

void expect_everywhere(bool mine, const std::string& what) {
  Tensor t = Tensor::from_host({mine ? 0.0f : 1.0f}, {1});
  world().all_reduce(t);
  EXPECT_EQ(t.item(), 0.0f) << what << ": wrong on " << t.item() << " rank(s)";
}

// Three broadcasts in a row, no barrier between: the last rank's, the middle one's, rank 0's.
TEST(Hidden03, TreeBroadcastBackToBackFromChangingRoots) {
  comm::Communicator& c = world();
  const int roots[] = {c.size() - 1, c.size() / 2, 0};
  for (std::size_t count : {std::size_t{3}, std::size_t{65537}}) {
    std::vector<Tensor> t;
    for (int k = 0; k < 3; ++k) t.push_back(rank_tensor(k, count, c.rank()));
    for (int k = 0; k < 3; ++k) chapter03::tree_broadcast(c, t[static_cast<std::size_t>(k)], roots[k]);
    for (int k = 0; k < 3; ++k) {
      const long at = first_wrong(t[static_cast<std::size_t>(k)].to_host(), count,
                                  [&](std::size_t i) { return value(k, roots[k], i); });
      if (at >= 0) ADD_FAILURE() << "rank " << c.rank() << " differs from root " << roots[k] << " at element " << at;
      expect_everywhere(at < 0, "broadcast " + std::to_string(k + 1) + " of 3 (" + std::to_string(count) +
                                    " elements from root " + std::to_string(roots[k]) + ")");
    }
  }
}

TEST(Hidden03, RingReduceScatterOfLargeOddChunksTwiceInARow) {
  comm::Communicator& c = world();
  const auto n = static_cast<std::size_t>(c.size());
  for (std::size_t each : {std::size_t{2}, std::size_t{4099}})
    for (int k = 0; k < 2; ++k) {
      Tensor input = rank_tensor(k, each * n, c.rank()), output = Tensor::full({static_cast<std::int64_t>(each)}, 99.0f);
      chapter03::ring_reduce_scatter(c, input, output);
      const long at = first_wrong(output.to_host(), each, [&](std::size_t i) {
        float sum = 0;
        for (int r = 0; r < c.size(); ++r) sum += value(k, r, static_cast<std::size_t>(c.rank()) * each + i);
        return sum;
      });
      if (at >= 0) ADD_FAILURE() << "rank " << c.rank() << "'s chunk is not the sum over the ranks at element " << at;
      expect_everywhere(at < 0, "reduce-scatter " + std::to_string(k + 1) + " of " + std::to_string(each) + " a rank");
    }
}

TEST(Hidden03, RingAllGatherOfLargeOddPiecesTwiceInARow) {
  comm::Communicator& c = world();
  const auto n = static_cast<std::size_t>(c.size());
  for (std::size_t each : {std::size_t{2}, std::size_t{4099}})
    for (int k = 0; k < 2; ++k) {
      Tensor input = rank_tensor(k, each, c.rank()), output = Tensor::full({static_cast<std::int64_t>(each * n)}, 99.0f);
      chapter03::ring_all_gather(c, input, output);
      const long at = first_wrong(output.to_host(), each * n,
                                  [&](std::size_t i) { return value(k, static_cast<int>(i / each), i % each); });
      if (at >= 0) ADD_FAILURE() << "rank " << c.rank() << " holds a wrong element " << at << " (rank " << at / static_cast<long>(each)
                                 << "'s piece)";
      expect_everywhere(at < 0, "all-gather " + std::to_string(k + 1) + " of " + std::to_string(each) + " a rank");
    }
}

}  // namespace
}  // namespace course::testing

COURSE_MPI_TEST_MAIN()
