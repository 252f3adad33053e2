// COURSE_CHECK_COLLECTIVES=1 (common/comm/consistency.cpp), under mpirun at 2 and 3 ranks: ranks that
// disagree on a collective's root, count, reduction or kind all stop at once with the same line, instead
// of waiting for each other; ranks that agree get the collective's usual result.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "support/mpi_main.h"

namespace course::testing {
namespace {

// Runs `call` and returns what it threw (every rank must throw), or "" when it did not.
template <class Call>
std::string thrown(Call call) {
  try {
    call();
  } catch (const std::logic_error& e) {
    return e.what();
  }
  return "";
}

TEST(CheckCollectives, IsOnInThisTest) {
  const char* on = std::getenv("COURSE_CHECK_COLLECTIVES");
  ASSERT_NE(on, nullptr);
  EXPECT_STREQ(on, "1");
}

TEST(CheckCollectives, AgreeingRanksGetTheCollectivesResult) {
  Tensor t = Tensor::from_host({static_cast<float>(world().rank() + 1)}, {1});
  world().all_reduce(t, comm::ReduceOp::sum);
  const int n = world().size();
  EXPECT_EQ(t.item(), static_cast<float>(n * (n + 1) / 2));
  Tensor b = Tensor::from_host({static_cast<float>(world().rank())}, {1});
  world().broadcast(b, n - 1);
  EXPECT_EQ(b.item(), static_cast<float>(n - 1));
}

TEST(CheckCollectives, RanksBroadcastingFromDifferentRootsAreNamed) {
  Tensor t = Tensor::zeros({4});
  const std::string what = thrown([&] { world().broadcast(t, world().rank()); });  // each rank its own root
  EXPECT_NE(what.find("the ranks disagree on the root: rank 0 gives 0, rank 1 gives 1"), std::string::npos) << what;
  EXPECT_EQ(what.find("broadcast #"), 0u) << what;
}

TEST(CheckCollectives, RanksReducingDifferentCountsAreNamed) {
  Tensor t = Tensor::zeros({4 + world().rank()});
  const std::string what = thrown([&] { world().all_reduce(t, comm::ReduceOp::sum); });
  EXPECT_NE(what.find("disagree on the element count: rank 0 gives 4, rank 1 gives 5"), std::string::npos) << what;
}

TEST(CheckCollectives, RanksInDifferentCollectivesAreNamed) {
  Tensor t = Tensor::zeros({2});
  const std::string what = thrown([&] {
    if (world().rank() == 0) world().all_reduce(t, comm::ReduceOp::sum);
    else world().barrier();  // a rank that went another way
  });
  EXPECT_NE(what.find("disagree on the collective: rank 0 gives all_reduce, rank 1 gives barrier"), std::string::npos)
      << what;
}

// Point to point is not collective: ranks that sent different numbers of messages still agree on the next
// collective (a pipeline's middle stages send more than its ends).
TEST(CheckCollectives, MessagesBetweenSomeRanksDoNotCount) {
  Tensor message = Tensor::zeros({3});
  if (world().rank() == 0) for (int i = 0; i < 2; ++i) world().send(message, 1);
  if (world().rank() == 1) for (int i = 0; i < 2; ++i) world().recv(message, 0);
  Tensor t = Tensor::ones({2});
  EXPECT_EQ(thrown([&] { world().all_reduce(t, comm::ReduceOp::sum); }), "");
  EXPECT_EQ(t.to_host(), std::vector<float>(2, static_cast<float>(world().size())));
}

// A rank that skipped a collective and calls another kind next is named there.
TEST(CheckCollectives, ARankThatSkippedACollectiveIsNamedAtItsNext) {
  Tensor t = Tensor::ones({2});
  const std::string what = thrown([&] {
    if (world().rank() != 1) world().broadcast(t, 0);  // rank 1 skips it
    world().all_reduce(t, comm::ReduceOp::sum);
  });
  EXPECT_NE(what.find("disagree on the collective: rank 0 gives broadcast, rank 1 gives all_reduce"), std::string::npos)
      << what;
}

TEST(CheckCollectives, RanksAveragingAgainstSummingAreNamed) {
  Tensor t = Tensor::zeros({2});
  const std::string what = thrown([&] {
    world().all_reduce(t, world().rank() == 0 ? comm::ReduceOp::average : comm::ReduceOp::sum);
  });
  EXPECT_NE(what.find("disagree on the reduction: rank 0 gives average, rank 1 gives sum"), std::string::npos) << what;
}

}  // namespace
}  // namespace course::testing

COURSE_MPI_TEST_MAIN()
