// MPI start-up, the world placement, and the backend choice.
#include "common/comm/environment.h"

#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <thread>

#include "common/comm/backends.h"
#include "common/core/log.h"

namespace course::comm {

namespace {

int* g_argc = nullptr;
char*** g_argv = nullptr;
MPI_Comm g_leaving = MPI_COMM_NULL;  // meet_before_leaving's own copy of the world

// The rank the launcher gave this process, before MPI starts: Open MPI's, or a PMI launcher's.
int launcher_rank() {
  for (const char* name : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"})
    if (const char* text = std::getenv(name)) return std::atoi(text);
  return 0;
}

// Whether a launcher started this process beside others, before MPI starts: Open MPI's mpirun and a PMI
// launcher say how many; a PMIx launcher (srun --mpi=pmix) names the rank alone, and MPI then tells.
bool launched_among_others() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"})
    if (const char* text = std::getenv(name)) return std::atoi(text) > 1;
  return std::getenv("PMIX_RANK") != nullptr;
}

void start_mpi() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized) return;
  // A rank waiting in a collective yields its core instead of spinning on it (Open MPI's
  // mpi_yield_when_idle; a setting given by the user wins). The communication thread waits while
  // backward computes, often on the same core: spinning took that core from backward, so overlap
  // (chapter 05) hid the communication only to lengthen the compute by as much.
  ::setenv("OMPI_MCA_mpi_yield_when_idle", "1", /*overwrite=*/0);
  int provided = 0;
  MPI_Init_thread(g_argc, g_argv, MPI_THREAD_MULTIPLE, &provided);
  if (provided < MPI_THREAD_MULTIPLE) {
    std::fprintf(stderr, "error: this MPI library does not support MPI_THREAD_MULTIPLE\n");
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  set_log_rank(rank, all_ranks_log());  // --verbose, read with the flags, stays
  MPI_Comm_dup(MPI_COMM_WORLD, &g_leaving);
}

}  // namespace

Environment::Environment(int& argc, char**& argv) {
  g_argc = &argc;
  g_argv = &argv;
  set_log_rank(launcher_rank());
}

Environment::~Environment() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized) return;
  if (g_leaving != MPI_COMM_NULL) MPI_Comm_free(&g_leaving);
  MPI_Finalize();
}

bool meet_before_leaving() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  // A program without an Environment (chapters 01 and 02) never starts MPI, not even here.
  if (finalized || (!initialized && (g_argc == nullptr || !launched_among_others()))) return true;
  start_mpi();
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size == 1) return true;
  MPI_Request request;
  MPI_Ibarrier(g_leaving, &request);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(kSecondsToMeetBeforeLeaving);
  for (int done = 0;;) {
    MPI_Test(&request, &done, MPI_STATUS_IGNORE);
    if (done) return true;
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

Placement world_placement() {
  start_mpi();
  Placement p;
  MPI_Comm_rank(MPI_COMM_WORLD, &p.rank);
  MPI_Comm_size(MPI_COMM_WORLD, &p.size);
  // The processes that share memory are the ones on this machine: their order is the local rank,
  // and the world rank of the first of them names the machine.
  MPI_Comm local;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, p.rank, MPI_INFO_NULL, &local);
  MPI_Comm_rank(local, &p.local_rank);
  MPI_Comm_size(local, &p.local_size);
  p.node = p.rank;
  MPI_Bcast(&p.node, 1, MPI_INT, 0, local);
  MPI_Comm_free(&local);
  const int first_on_its_machine = p.local_rank == 0 ? 1 : 0;
  MPI_Allreduce(&first_on_its_machine, &p.machines, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  return p;
}

std::unique_ptr<Communicator> make_world(const std::string& backend, Device device, double timeout_seconds,
                                         bool announce) {
  if (backend != "auto" && backend != "mpi" && backend != "nccl")
    throw UsageError("unknown backend '" + backend + "' (expected auto, mpi or nccl)");
  if (!(timeout_seconds > 0) || timeout_seconds > kMaxTimeoutSeconds)
    throw UsageError("timeout must be between 0 and " + std::to_string(static_cast<long>(kMaxTimeoutSeconds)) +
                     " seconds");
  const Placement placement = world_placement();
  // NCCL needs CUDA tensors and one GPU per rank (two ranks on one GPU: "Duplicate GPU detected").
  std::string why_not_nccl;
  int gpus = cuda_device_count();
  // The first reason that holds, the most basic first: a machine without a GPU says so, whatever its build.
  if (device != Device::cuda) why_not_nccl = gpus == 0 ? "no usable GPU" : "the tensors are on the CPU";
  else if (!COURSE_HAVE_NCCL) why_not_nccl = "this build has no NCCL";
  else if (placement.local_size > gpus)
    why_not_nccl = std::to_string(placement.local_size) + " ranks on this machine share " + std::to_string(gpus) +
                   " GPU(s); NCCL needs one GPU per rank";
  if (backend == "nccl" && !why_not_nccl.empty()) throw UsageError("nccl: " + why_not_nccl + " (use mpi)");
  bool use_nccl = backend == "nccl" || (backend == "auto" && why_not_nccl.empty());
  std::unique_ptr<Communicator> world;
#if COURSE_HAVE_NCCL
  if (use_nccl) world = make_nccl_communicator(placement);
#endif
  if (!world) world = make_mpi_communicator(placement);
  world->set_timeout(std::chrono::milliseconds(static_cast<long>(timeout_seconds * 1000)));
  if (announce) {
    // Across machines, say how many (and how many ranks each), so a hostfile that put every rank on one
    // machine shows.
    const std::string machines = placement.machines == 1 ? "" : "; " + std::to_string(placement.size) + " ranks on " +
                                                                    std::to_string(placement.machines) + " machines";
    if (backend == "auto")
      log("Backend: %s (auto: %s)%s\n", world->backend_name().c_str(),
          use_nccl ? "every rank has its own GPU" : why_not_nccl.c_str(), machines.c_str());
    else
      log("Backend: %s%s\n", world->backend_name().c_str(), machines.c_str());
  }
  return world;
}

}  // namespace course::comm
