// Reading and widening a process's CPU affinity, and choosing its kernels' threads from it.
#include "common/core/cpu_cores.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <string>

#include "common/core/errors.h"
#include "common/kernels/kernels.h"

namespace course {
namespace {

int allowed_cores() {
  cpu_set_t mask;
  CPU_ZERO(&mask);
  if (sched_getaffinity(0, sizeof mask, &mask) != 0) return 1;
  return std::max(1, CPU_COUNT(&mask));
}

int online_cores() { return std::max(1, static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN))); }

// The cores the launcher itself may use (the parent's affinity: mpirun's, which a user's `taskset -c 0
// mpirun ...` narrows, while the launcher's binding of this rank is its own choice), else every online
// core; the kernel keeps only those the process's cpuset (a batch job's cgroup) permits.
void widen_to_every_core(int machine) {
  cpu_set_t mask;
  CPU_ZERO(&mask);
  if (sched_getaffinity(getppid(), sizeof mask, &mask) != 0 || CPU_COUNT(&mask) == 0) {
    CPU_ZERO(&mask);
    for (int cpu = 0; cpu < machine && cpu < CPU_SETSIZE; ++cpu) CPU_SET(cpu, &mask);
  }
  sched_setaffinity(0, sizeof mask, &mask);  // on failure the launcher's binding stays: allowed_cores() says so
}

// The most threads a variable may ask for: CPU_SETSIZE's cores, one thread each.
constexpr long kMostThreads = CPU_SETSIZE;

// OMP_NUM_THREADS or OPENBLAS_NUM_THREADS as a count of threads, read whole: decimal digits, 1 to
// kMostThreads (atoi read "1e3" as 1 and "3abc" as 3, where libgomp calls both invalid). Unset or empty:
// 0, not given; anything else a UsageError naming the variable.
int threads_asked(const char* name) {
  const char* text = std::getenv(name);
  if (!text || !*text) return 0;
  const std::string value(text);
  const bool digits = value.size() <= 9 && value.find_first_not_of("0123456789") == std::string::npos;
  const long threads = digits ? std::stol(value) : 0;
  if (threads < 1 || threads > kMostThreads)
    throw UsageError(std::string(name) + ": '" + value + "' is not a number of threads from 1 to " +
                     std::to_string(kMostThreads));
  return static_cast<int>(threads);
}

// Whether an MPI launcher started this process (and so may have bound it to a core of its choosing);
// without one, a narrow affinity is the user's own (taskset) and stays. Read as the program loads,
// before MPI starts: a process started alone becomes a singleton whose MPI sets the same variables.
bool launched_by_mpi() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK"})
    if (std::getenv(name)) return true;
  return false;
}
const bool g_launched = launched_by_mpi();

std::mutex g_mutex;
bool g_placed = false;
CpuCores g_cores;

}  // namespace

CpuCores place_cpu_threads(int ranks_on_this_machine) {
  CpuCores c;
  c.machine = online_cores();
  c.bound = c.allowed = allowed_cores();
  const char* variable = nullptr;
  int asked = 0;
  for (const char* name : {"OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"})
    if (const int threads = threads_asked(name); !variable && threads > 0) variable = name, asked = threads;
  if (variable) {
    c.threads = asked;
    c.why = std::string(variable) + " set";
  } else if (ranks_on_this_machine <= 1) {
    if (c.allowed < c.machine && g_launched) {
      widen_to_every_core(c.machine);
      c.allowed = allowed_cores();
    }
    c.threads = c.allowed;
    c.why = c.allowed > c.bound ? "one rank on this machine, unbound from the " + std::to_string(c.bound) +
                                      (c.bound == 1 ? " core" : " cores") + " its launcher gave it"
                                : "one rank on this machine";
  } else {
    c.threads = std::max(1, std::min(c.allowed, c.machine / ranks_on_this_machine));
    c.why = std::to_string(ranks_on_this_machine) + " ranks on this machine";
  }
  set_cpu_threads(c.threads);
  std::lock_guard<std::mutex> lock(g_mutex);
  g_cores = c;
  g_placed = true;
  return c;
}

CpuCores cpu_cores() {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_placed) return g_cores;
  CpuCores c;
  c.machine = online_cores();
  c.bound = c.allowed = allowed_cores();
  c.threads = cpu_threads();
  c.why = "as the process started";
  return c;
}

std::string describe(const CpuCores& c) {
  return std::to_string(c.threads) + (c.threads == 1 ? " thread" : " threads") + " on " + std::to_string(c.allowed) +
         " of " + std::to_string(c.machine) + " cores (" + c.why + ")";
}

}  // namespace course
