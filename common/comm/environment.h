// Launch: MPI start-up and shut-down, where this process sits in the world, and the backend choice.
// Without mpirun the program runs as a world of one.
#pragma once
#include <memory>
#include <string>

#include "common/comm/communicator.h"

namespace course::comm {

// MPI for the program's lifetime: MPI_Init_thread(MPI_THREAD_MULTIPLE) when the world is first asked for
// (world_placement), MPI_Finalize on destruction. Reading the flags comes before: a bad flag or --help
// ends the program without starting MPI (alone, that is half a second spent on a helper daemon), with
// the rank the launcher gave (OMPI_COMM_WORLD_RANK) telling the logger which process speaks. It stores
// nothing else: the world communicator (or the topology built on it) is where ranks are kept.
class Environment {
 public:
  Environment(int& argc, char**& argv);  // also tells the logger this process's rank, from the launcher
  ~Environment();
  Environment(const Environment&) = delete;
  Environment& operator=(const Environment&) = delete;
};

// This process's place in MPI_COMM_WORLD, read from MPI (the launcher decides it): rank, size,
// and rank and count among the processes on this machine. Starts MPI if it has not started yet.
Placement world_placement();

// --backend auto|mpi|nccl. auto: NCCL when every rank has a GPU of its own, MPI otherwise; rank 0
// prints the choice. Asking for nccl without one GPU per rank is a UsageError that says why.
std::unique_ptr<Communicator> make_world(const std::string& backend, Device device, double timeout_seconds,
                                         bool announce = true);

}  // namespace course::comm
