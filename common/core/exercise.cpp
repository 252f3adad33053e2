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

// How long a rank that reached the stub waits for the others to reach it too, at most (a rank that never
// does is a participant's bug elsewhere; the job still ends, with the line).
constexpr auto kMeetingLimit = std::chrono::seconds(30);

}  // namespace

void not_done(const char* id, const char* what, const char* where, const char* handout) {
  // Under mpirun every rank reaches this line: rank 0 speaks (a run without a launcher is rank 0).
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
  if (rank == 0) std::fprintf(stderr, "exercise %s (%s, %s) is not done yet; see %s\n", id, what, where, handout);
  std::fflush(stderr);
  if (mpi) {
    // The launcher ends the whole job at the first rank's exit, which could cut rank 0's line off before
    // it is out: every rank leaves once all have arrived here (rank 0 has spoken by then).
    MPI_Request meeting;
    MPI_Ibarrier(MPI_COMM_WORLD, &meeting);
    int met = 0;
    const auto until = std::chrono::steady_clock::now() + kMeetingLimit;
    while (!met && std::chrono::steady_clock::now() < until) {
      MPI_Test(&meeting, &met, MPI_STATUS_IGNORE);
      if (!met) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  std::exit(kNotDone);
}

}  // namespace course::exercise
