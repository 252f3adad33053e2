// The two backends' factories, each making a communicator over the whole world. make_world
// (environment.h) chooses between them; tests call them directly.
#pragma once
#include <memory>

#include "common/comm/communicator.h"

namespace course::comm {

// Open MPI over a duplicate of MPI_COMM_WORLD; collectives on a communication thread.
std::unique_ptr<Communicator> make_mpi_communicator(const Placement& world);

#if COURSE_HAVE_NCCL
// NCCL, one GPU per rank (the one select_device chose); rank 0 makes the id and MPI broadcasts it.
std::unique_ptr<Communicator> make_nccl_communicator(const Placement& world);
#endif

}  // namespace course::comm
