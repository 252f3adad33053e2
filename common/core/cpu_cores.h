// The cores a process runs on and the threads its CPU kernels use. mpirun binds each rank to one core
// when it starts two or fewer (Open MPI's default), which suits ranks sharing a machine and starves a rank
// alone: its kernels' threads all run on core 0. So a rank alone on its machine widens its affinity to every
// core the system lets it use (a cgroup's cpuset still bounds it) and says so; ranks sharing a machine keep
// their launcher's binding and split its cores.
#pragma once
#include <string>

namespace course {

struct CpuCores {
  int machine = 1;   // the machine's online cores
  int allowed = 1;   // the cores this process may run on (its affinity mask), after any widening
  int bound = 1;     // the cores its launcher had bound it to
  int threads = 1;   // the CPU kernels' threads
  std::string why;   // how the threads were chosen, in a few words
};

// Chooses the threads for a process with `ranks_on_this_machine` ranks on its machine (itself included):
// OMP_NUM_THREADS or OPENBLAS_NUM_THREADS when set (the user's choice); for a rank alone, every core, its
// affinity widened first if its launcher bound it to fewer; for ranks sharing the machine, the cores of
// their own mask, at most the machine's cores divided among the ranks, at least one. Sets them
// (set_cpu_threads) and returns the choice. Call before any CPU kernel runs: threads made before it keep
// the old binding.
CpuCores place_cpu_threads(int ranks_on_this_machine);

// The last choice place_cpu_threads made (or the process's mask and cpu_threads() if none was).
CpuCores cpu_cores();
std::string describe(const CpuCores& cores);  // "2 threads on 2 of 2 cores (...)"

}  // namespace course
