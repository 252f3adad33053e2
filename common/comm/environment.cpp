// MPI start-up, local ranks, and the backend choice.
#include "common/comm/environment.h"

#include <mpi.h>

#include <cstdio>
#include <stdexcept>

#include "common/cli/log.h"

namespace course::comm {

#if COURSE_HAVE_NCCL
std::unique_ptr<Communicator> make_nccl_communicator(int rank, int size, int local_rank, int local_size);  // nccl_communicator.cpp
#endif

Environment::Environment(int& argc, char**& argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  if (provided < MPI_THREAD_MULTIPLE) {
    std::fprintf(stderr, "error: this MPI library does not support MPI_THREAD_MULTIPLE\n");
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &size_);
  // The processes that share memory are the ones on this machine: their order is the local rank.
  MPI_Comm local;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &local);
  MPI_Comm_rank(local, &local_rank_);
  MPI_Comm_size(local, &local_size_);
  MPI_Comm_free(&local);
  set_log_rank(rank_);
}

Environment::~Environment() { MPI_Finalize(); }

std::unique_ptr<Communicator> make_world(const Environment& env, const std::string& backend, Device device,
                                         double timeout_seconds, bool announce) {
  if (backend != "auto" && backend != "mpi" && backend != "nccl")
    throw UsageError("--backend: unknown backend '" + backend + "' (expected auto, mpi or nccl)");
  if (!(timeout_seconds > 0)) throw UsageError("--timeout: must be a positive number of seconds");
  // NCCL needs CUDA tensors and one GPU per rank (two ranks on one GPU: "Duplicate GPU detected").
  std::string why_not_nccl;
  int gpus = cuda_device_count();
#if !COURSE_HAVE_NCCL
  why_not_nccl = "this build has no NCCL";
#else
  if (device != Device::cuda) why_not_nccl = gpus == 0 ? "no usable GPU" : "the tensors are on the CPU (--device cpu)";
  else if (env.local_size() > gpus)
    why_not_nccl = std::to_string(env.local_size()) + " ranks on this machine share " + std::to_string(gpus) +
                   " GPU(s); NCCL needs one GPU per rank";
#endif
  if (backend == "nccl" && !why_not_nccl.empty())
    throw UsageError("--backend nccl: " + why_not_nccl + " (use --backend mpi)");
  bool use_nccl = backend == "nccl" || (backend == "auto" && why_not_nccl.empty());
  std::unique_ptr<Communicator> world;
#if COURSE_HAVE_NCCL
  if (use_nccl) world = make_nccl_communicator(env.rank(), env.size(), env.local_rank(), env.local_size());
#endif
  if (!world) world = make_mpi_communicator(env.local_rank(), env.local_size());
  world->set_timeout(std::chrono::milliseconds(static_cast<long>(timeout_seconds * 1000)));
  if (announce) {
    if (backend == "auto")
      log("Backend: %s (auto: %s)\n", world->backend_name().c_str(),
          use_nccl ? "every rank has its own GPU" : why_not_nccl.c_str());
    else
      log("Backend: %s\n", world->backend_name().c_str());
  }
  return world;
}

}  // namespace course::comm
