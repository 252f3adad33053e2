// Launch: MPI start-up and shut-down, world/local ranks from the launcher, and the backend choice.
// Without mpirun the program runs as a world of one.
#pragma once
#include <memory>
#include <string>

#include "common/comm/communicator.h"

namespace course::comm {

class Environment {
 public:
  Environment(int& argc, char**& argv);  // MPI_Init_thread(MPI_THREAD_MULTIPLE); sets the logging rank
  ~Environment();                        // MPI_Finalize
  Environment(const Environment&) = delete;
  Environment& operator=(const Environment&) = delete;
  int rank() const { return rank_; }
  int size() const { return size_; }
  int local_rank() const { return local_rank_; }    // rank among the processes on this machine
  int local_size() const { return local_size_; }

 private:
  int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1;
};

// --backend auto|mpi|nccl. auto: NCCL when every rank has a GPU of its own, MPI otherwise; rank 0
// prints the choice. nccl without one GPU per rank is a UsageError that says why.
std::unique_ptr<Communicator> make_world(const Environment& env, const std::string& backend, Device device,
                                         double timeout_seconds, bool announce = true);

// The MPI backend over an existing MPI communicator (duplicated); used by make_world and tests.
std::unique_ptr<Communicator> make_mpi_communicator(int local_rank, int local_size);

}  // namespace course::comm
