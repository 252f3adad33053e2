// main() for GoogleTest under mpirun: every rank runs every test, rank 0 prints, and the job fails
// if any rank failed; it is reported skipped (every_test_skipped.h) only when every rank skipped every
// test. Tests reach the world communicator through world().
#pragma once
#include <gtest/gtest.h>
#include <mpi.h>

#include "common/comm/backends.h"
#include "common/comm/environment.h"
#include "support/every_test_skipped.h"

namespace course::testing {
inline comm::Communicator*& world_slot() {
  static comm::Communicator* w = nullptr;
  return w;
}
inline comm::Communicator& world() { return *world_slot(); }
}  // namespace course::testing

#define COURSE_MPI_TEST_MAIN()                                                                    \
  int main(int argc, char** argv) {                                                               \
    course::comm::Environment env(argc, argv);                                                    \
    ::testing::InitGoogleTest(&argc, argv);                                                       \
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();                            \
    const course::comm::Placement placement = course::comm::world_placement();                   \
    if (placement.rank != 0) delete listeners.Release(listeners.default_result_printer());        \
    int failed = 0;                                                                               \
    {                                                                                             \
      auto w = course::comm::make_mpi_communicator(placement);                                    \
      w->set_timeout(std::chrono::seconds(120));                                                  \
      course::testing::world_slot() = w.get();                                                    \
      failed = RUN_ALL_TESTS();                                                                   \
      MPI_Allreduce(MPI_IN_PLACE, &failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);                  \
      int skipped = course::testing::every_test_skipped() ? 1 : 0;                                \
      MPI_Allreduce(MPI_IN_PLACE, &skipped, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);                 \
      if (skipped && placement.rank == 0) course::testing::say_every_test_skipped();              \
      course::testing::world_slot() = nullptr;                                                    \
    }                                                                                             \
    return failed;                                                                                \
  }
