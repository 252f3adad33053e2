// The stub of a workshop exercise not written yet.
#include "common/core/exercise.h"

#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

namespace course::exercise {
namespace {

// How long a rank that reached the stub waits for the others to reach it too, at most. Some exercises are
// reached by one rank alone (06.1: the rank that writes the checkpoint); the others then wait in their
// next collective, and the job ends when this rank exits. Long enough for ranks that arrive together on a
// busy machine to leave together, short enough that a test running a chapter many times is not held.
constexpr auto kMeetingLimit = std::chrono::seconds(2);

}  // namespace

void not_done(const char* id, const char* what, const char* where, const char* handout) {
  // Rank 0 speaks at once (a run without a launcher is rank 0); another rank only when not every rank
  // arrived (rank 0 may never come, and the job ends at this rank's exit): the line is said once when all
  // arrive, and never lost when one arrives alone.
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  const bool mpi = initialized && !finalized;
  int rank = 0;
  if (mpi) {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  } else if (const char* launched = std::getenv("OMPI_COMM_WORLD_RANK")) {
    rank = std::atoi(launched);
  }
  const auto say = [&] {
    std::fprintf(stderr, "exercise %s (%s, %s) is not done yet; see %s\n", id, what, where, handout);
    std::fflush(stderr);
  };
  if (rank == 0) say();
  if (mpi) {
    // The launcher ends the whole job at the first rank's exit, which could cut rank 0's line off before
    // it is out: ranks that arrive together leave together (rank 0 has spoken by then).
    MPI_Request meeting;
    MPI_Ibarrier(MPI_COMM_WORLD, &meeting);
    int met = 0;
    const auto until = std::chrono::steady_clock::now() + kMeetingLimit;
    while (!met && std::chrono::steady_clock::now() < until) {
      MPI_Test(&meeting, &met, MPI_STATUS_IGNORE);
      if (!met) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    if (!met && rank != 0) say();
  }
  std::exit(kNotDone);
}

}  // namespace course::exercise
