// Chapter 03's exercises graded (03_collectives/collectives.cpp): the participant's tree broadcast, ring
// reduce-scatter and ring all-gather under mpirun at 1, 2, 3 and 5 ranks, against what the collective
// means: every root, counts that do not divide or are empty, and the all-reduce the two rings make.
// Inputs are small integers in float, so every sum is exact and results are compared exactly.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "03_collectives/collectives.h"
#include "support/mpi_main.h"

namespace course::testing {
namespace {

// Rank r's element i: (r + 1) * (i % 7 + 1); sums over 5 ranks stay exact.
float value(int rank, std::size_t i) { return static_cast<float>((rank + 1) * static_cast<int>(i % 7 + 1)); }

Tensor rank_tensor(std::size_t count, int rank) {
  std::vector<float> v(count);
  for (std::size_t i = 0; i < count; ++i) v[i] = value(rank, i);
  return Tensor::from_host(v, {static_cast<std::int64_t>(count)});
}

// Whether every rank passed; a rank's own failures are reported by GoogleTest on that rank.
void expect_everywhere(bool mine, const std::string& what) {
  float bad = mine ? 0.0f : 1.0f;
  Tensor t = Tensor::from_host({bad}, {1});
  world().all_reduce(t);
  EXPECT_EQ(t.item(), 0.0f) << what << ": wrong on " << t.item() << " rank(s)";
}

TEST(Exercise03, TreeBroadcastReachesEveryRankFromAnyRoot) {
  comm::Communicator& c = world();
  for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{5}, std::size_t{1000}})
    for (int root = 0; root < c.size(); ++root) {
      Tensor t = rank_tensor(count, c.rank());
      chapter03::tree_broadcast(c, t, root);
      const auto got = t.to_host();
      bool ok = true;
      for (std::size_t i = 0; i < count && ok; ++i)
        if (got[i] != value(root, i)) {
          ADD_FAILURE() << "rank " << c.rank() << " holds " << got[i] << " at element " << i << " after a broadcast of "
                        << count << " from root " << root << "; the root's is " << value(root, i);
          ok = false;
        }
      expect_everywhere(ok, "tree_broadcast of " + std::to_string(count) + " from root " + std::to_string(root));
    }
}

TEST(Exercise03, RingReduceScatterLeavesEachRankTheSumOfItsChunk) {
  comm::Communicator& c = world();
  const auto n = static_cast<std::size_t>(c.size());
  for (std::size_t each : {std::size_t{0}, std::size_t{1}, std::size_t{3}, std::size_t{257}}) {
    Tensor input = rank_tensor(each * n, c.rank()), output = Tensor::full({static_cast<std::int64_t>(each)}, -1.0f);
    chapter03::ring_reduce_scatter(c, input, output);
    const auto got = output.to_host();
    bool ok = true;
    for (std::size_t i = 0; i < each && ok; ++i) {
      float sum = 0;
      for (int r = 0; r < c.size(); ++r) sum += value(r, static_cast<std::size_t>(c.rank()) * each + i);
      if (got[i] != sum) {
        ADD_FAILURE() << "rank " << c.rank() << "'s element " << i << " of its chunk is " << got[i]
                      << " after a reduce-scatter of " << each << " a rank; the sum over the ranks is " << sum;
        ok = false;
      }
    }
    const auto untouched = input.to_host();
    for (std::size_t i = 0; i < each * n && ok; ++i)
      if (untouched[i] != value(c.rank(), i)) {
        ADD_FAILURE() << "rank " << c.rank() << "'s input changed at element " << i << " (the input is const)";
        ok = false;
      }
    expect_everywhere(ok, "ring_reduce_scatter of " + std::to_string(each) + " a rank");
  }
}

TEST(Exercise03, RingAllGatherPutsEveryPieceInItsPlace) {
  comm::Communicator& c = world();
  const auto n = static_cast<std::size_t>(c.size());
  for (std::size_t each : {std::size_t{0}, std::size_t{1}, std::size_t{5}, std::size_t{1000}}) {
    Tensor input = rank_tensor(each, c.rank()), output = Tensor::full({static_cast<std::int64_t>(each * n)}, -1.0f);
    chapter03::ring_all_gather(c, input, output);
    const auto got = output.to_host();
    bool ok = true;
    for (std::size_t r = 0; r < n && ok; ++r)
      for (std::size_t i = 0; i < each && ok; ++i)
        if (got[r * each + i] != value(static_cast<int>(r), i)) {
          ADD_FAILURE() << "rank " << c.rank() << " holds " << got[r * each + i] << " at rank " << r
                        << "'s element " << i << " after an all-gather of " << each << "; rank " << r << " sent "
                        << value(static_cast<int>(r), i);
          ok = false;
        }
    expect_everywhere(ok, "ring_all_gather of " + std::to_string(each));
  }
}

// The two rings in turn: the sum everywhere, for counts that do not divide by the ranks too.
TEST(Exercise03, RingAllReduceIsTheTwoRingsInTurn) {
  comm::Communicator& c = world();
  for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{4}, std::size_t{1001}}) {
    Tensor t = rank_tensor(count, c.rank());
    chapter03::ring_all_reduce(c, t);
    const auto got = t.to_host();
    bool ok = true;
    for (std::size_t i = 0; i < count && ok; ++i) {
      float sum = 0;
      for (int r = 0; r < c.size(); ++r) sum += value(r, i);
      if (got[i] != sum) {
        ADD_FAILURE() << "rank " << c.rank() << " holds " << got[i] << " at element " << i << " of an all-reduce of "
                      << count << "; the sum is " << sum;
        ok = false;
      }
    }
    expect_everywhere(ok, "ring_all_reduce of " + std::to_string(count));
  }
}

}  // namespace
}  // namespace course::testing

COURSE_MPI_TEST_MAIN()
