// The topology under mpirun with 4 ranks: the groups, coordinates and pipeline neighbours of a
// TP 2 x DP 2 grid, a TP 2 x CP 2 and a CP 2 x DP 2 grid, a PP 2 x DP 2 grid and a 1 x 4 pipeline,
// each checked against the layout world rank = ((dp * PP + pp) * CP + cp) * TP + tp; and split()
// computing the new group's own local ranks.
#include <gtest/gtest.h>

#include "common/comm/backends.h"
#include "common/comm/environment.h"
#include "common/core/errors.h"
#include "common/parallel/topology.h"
#include "support/mpi_main.h"

namespace course::testing {
namespace {

std::unique_ptr<parallel::Topology> grid(int tp, int pp, int dp, int cp = 1) {
  return std::make_unique<parallel::Topology>(comm::make_mpi_communicator(comm::world_placement()),
                                              parallel::GridShape{tp, pp, dp, cp});
}

// The world ranks of a group's members, in group order (gathered over the group).
std::vector<int> members(comm::Communicator& group) {
  Tensor mine = Tensor::from_host({static_cast<float>(world().rank())}, {1});
  Tensor all = Tensor::zeros({group.size()});
  group.all_gather(mine, all);
  std::vector<int> out;
  for (float v : all.to_host()) out.push_back(static_cast<int>(v));
  return out;
}

TEST(Topology, TensorTimesDataParallelTwoByTwo) {
  if (world().size() != 4) GTEST_SKIP() << "the grid test needs 4 ranks";
  auto t = grid(2, 1, 2);
  const int r = world().rank();
  EXPECT_EQ(t->tp_rank(), r % 2);
  EXPECT_EQ(t->dp_rank(), r / 2);
  EXPECT_EQ(t->pp_rank(), 0);
  // TP groups are consecutive ranks {0,1} {2,3}; DP groups are strided {0,2} {1,3}.
  EXPECT_EQ(members(t->tp_group()), (std::vector<int>{r / 2 * 2, r / 2 * 2 + 1}));
  EXPECT_EQ(members(t->dp_group()), (std::vector<int>{r % 2, r % 2 + 2}));
  EXPECT_EQ(t->pp_group().size(), 1);
  EXPECT_EQ(t->previous_stage(), -1);
  EXPECT_EQ(t->next_stage(), -1);
  EXPECT_EQ(t->describe(), "TP(2)-PP(1)-DP(2)-Rank(" + std::to_string(r) + ")");
  // All four ranks share this machine: each two-rank group has two local members, in group order.
  EXPECT_EQ(t->tp_group().local_size(), 2);
  EXPECT_EQ(t->tp_group().local_rank(), t->tp_rank());
  EXPECT_EQ(t->dp_group().local_size(), 2);
  EXPECT_EQ(t->dp_group().local_rank(), t->dp_rank());
}

// TP fastest, then CP: world rank = ((dp PP + pp) CP + cp) TP + tp.
TEST(Topology, TensorTimesContextParallelTwoByTwo) {
  if (world().size() != 4) GTEST_SKIP() << "the grid test needs 4 ranks";
  auto t = grid(2, 1, 0, 2);
  const int r = world().rank();
  EXPECT_EQ(t->dp_size(), 1);
  EXPECT_EQ(t->tp_rank(), r % 2);
  EXPECT_EQ(t->cp_rank(), r / 2);
  EXPECT_EQ(members(t->tp_group()), (std::vector<int>{r / 2 * 2, r / 2 * 2 + 1}));
  EXPECT_EQ(members(t->cp_group()), (std::vector<int>{r % 2, r % 2 + 2}));
  // The ranks that hold the same parameters: the CP ranks of the one replica.
  EXPECT_EQ(members(t->dp_cp_group()), members(t->cp_group()));
  EXPECT_EQ(t->dp_group().size(), 1);
  EXPECT_EQ(t->describe(), "TP(2)-CP(2)-PP(1)-DP(1)-Rank(" + std::to_string(r) + ")");
  parallel::Coordinates at;
  at.tp = t->tp_rank(), at.cp = t->cp_rank();
  EXPECT_EQ(t->world_rank(at), r);
}

TEST(Topology, ContextTimesDataParallelAverageTogether) {
  if (world().size() != 4) GTEST_SKIP() << "the grid test needs 4 ranks";
  auto t = grid(1, 1, 2, 2);
  const int r = world().rank();
  EXPECT_EQ(t->cp_rank(), r % 2);
  EXPECT_EQ(t->dp_rank(), r / 2);
  EXPECT_EQ(members(t->cp_group()), (std::vector<int>{r / 2 * 2, r / 2 * 2 + 1}));
  EXPECT_EQ(members(t->dp_group()), (std::vector<int>{r % 2, r % 2 + 2}));
  EXPECT_EQ(members(t->dp_cp_group()), (std::vector<int>{0, 1, 2, 3}));
  // Without CP the average runs over the replicas alone.
  auto plain = grid(1, 2, 2);
  EXPECT_EQ(&plain->dp_cp_group(), &plain->dp_group());
  EXPECT_THROW(grid(1, 1, 0, 3), UsageError);  // 4 ranks do not divide into CP 3
}

TEST(Topology, PipelineTimesDataParallelTwoByTwo) {
  if (world().size() != 4) GTEST_SKIP() << "the grid test needs 4 ranks";
  auto t = grid(1, 2, 2);
  const int r = world().rank();
  EXPECT_EQ(t->pp_rank(), r % 2);
  EXPECT_EQ(t->dp_rank(), r / 2);
  EXPECT_EQ(members(t->pp_group()), (std::vector<int>{r / 2 * 2, r / 2 * 2 + 1}));
  EXPECT_EQ(members(t->dp_group()), (std::vector<int>{r % 2, r % 2 + 2}));
  EXPECT_EQ(t->is_first_stage(), r % 2 == 0);
  EXPECT_EQ(t->is_last_stage(), r % 2 == 1);
  EXPECT_EQ(t->previous_stage(), r % 2 == 0 ? -1 : 0);
  EXPECT_EQ(t->next_stage(), r % 2 == 0 ? 1 : -1);
  // The neighbour found through the coordinates is the same rank the group talks to.
  if (t->next_stage() >= 0) {
    EXPECT_EQ(t->world_rank({0, t->next_stage(), t->dp_rank()}), r + 1);
  }
}

TEST(Topology, OneByFourPipeline) {
  if (world().size() != 4) GTEST_SKIP() << "the grid test needs 4 ranks";
  auto t = grid(1, 4, 1);
  const int r = world().rank();
  EXPECT_EQ(t->pp_rank(), r);
  EXPECT_EQ(t->dp_size(), 1);
  EXPECT_EQ(members(t->pp_group()), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(t->previous_stage(), r - 1);
  EXPECT_EQ(t->next_stage(), r == 3 ? -1 : r + 1);
  EXPECT_EQ(t->describe(), "TP(1)-PP(4)-DP(1)-Rank(" + std::to_string(r) + ")");
  // Sends along the pipeline reach the next stage.
  Tensor activation = Tensor::full({3}, static_cast<float>(r));
  Tensor received = Tensor::zeros({3});
  comm::WorkHandle send, recv;
  if (t->next_stage() >= 0) send = t->pp_group().send_async(activation, t->next_stage());
  if (t->previous_stage() >= 0) recv = t->pp_group().recv_async(received, t->previous_stage());
  if (recv) {
    recv->wait();
    EXPECT_EQ(received.to_host(), std::vector<float>(3, static_cast<float>(r - 1)));
  }
  if (send) send->wait();
}

TEST(Topology, PureDataParallelByDefault) {
  auto t = grid(1, 1, 0);
  EXPECT_EQ(t->dp_size(), world().size());
  EXPECT_EQ(t->dp_rank(), world().rank());
  EXPECT_EQ(&t->dp_group(), &t->world());  // no extra communicator for pure data parallelism
  EXPECT_EQ(t->describe(), "TP(1)-PP(1)-DP(" + std::to_string(world().size()) + ")-Rank(" +
                               std::to_string(world().rank()) + ")");
}

TEST(Topology, RejectsAShapeThatDoesNotFitTheWorld) {
  EXPECT_THROW(grid(world().size() + 1, 1, 0), UsageError);
  EXPECT_THROW(grid(1, 1, world().size() + 1), UsageError);
  EXPECT_THROW(grid(0, 1, 0), UsageError);
}

TEST(Communicator, SplitCountsTheNewGroupsOwnLocalRanks) {
  // Even and odd ranks: on one machine each half has its own local ranks 0, 1, ...
  auto half = world().split(world().rank() % 2, world().rank());
  EXPECT_EQ(half->local_size(), half->size());
  EXPECT_EQ(half->local_rank(), half->rank());
  EXPECT_EQ(half->rank(), world().rank() / 2);
  EXPECT_EQ(half->timeout(), world().timeout());  // inherited
}

}  // namespace
}  // namespace course::testing

COURSE_MPI_TEST_MAIN()
