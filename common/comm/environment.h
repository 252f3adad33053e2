// Launch: MPI start-up and shut-down, where this process sits in the world, and the backend choice.
// Without mpirun the program runs as a world of one.
#pragma once
#include <memory>
#include <string>

#include "common/comm/communicator.h"

namespace course::comm {

// MPI for the program's lifetime: MPI_Init_thread(MPI_THREAD_MULTIPLE) when the world is first asked for
// (world_placement), MPI_Finalize on destruction. Reading the flags comes before: --help, or a bad flag
// in a process started alone, ends the program without starting MPI (alone, that is half a second spent
// on a helper daemon; under mpirun a bad flag starts it to meet the other ranks before leaving, below),
// with the rank the launcher gave (OMPI_COMM_WORLD_RANK) telling the logger which process speaks. It
// stores nothing else: the world communicator (or the topology built on it) is where ranks are kept.
class Environment {
 public:
  Environment(int& argc, char**& argv);  // also tells the logger this process's rank, from the launcher
  ~Environment();
  Environment(const Environment&) = delete;
  Environment& operator=(const Environment&) = delete;
};

// Called by every rank that leaves on an error all ranks meet alike (a bad flag), after rank 0 has
// written its one line: the ranks meet, then leave together. mpirun stops a job when its first process
// exits with an error, and stops the ranks still running then; a rank that left first could cut rank
// 0 off before its line was out (Open MPI's one-second grace, odls_base_sigkill_timeout, mostly let it
// through, at the cost of that second on every failed job). Under a launcher of more than one rank this
// starts MPI if the error came before it had, and meets on a communicator kept for it alone, so no
// collective in flight can be matched against it. False when the other ranks did not come within
// kSecondsToMeetBeforeLeaving: they did not fail (the error was this rank's alone), and the caller says
// so itself and aborts the job.
bool meet_before_leaving();
inline constexpr double kSecondsToMeetBeforeLeaving = 5.0;

// This process's place in MPI_COMM_WORLD, read from MPI (the launcher decides it): rank, size,
// and rank and count among the processes on this machine. Starts MPI if it has not started yet.
Placement world_placement();

// --backend auto|mpi|nccl. auto: NCCL when every rank has a GPU of its own, MPI otherwise; rank 0
// prints the choice. Asking for nccl without one GPU per rank is a UsageError that says why.
std::unique_ptr<Communicator> make_world(const std::string& backend, Device device, double timeout_seconds,
                                         bool announce = true);

}  // namespace course::comm
