// The chapters graded on a GPU (each chapter's RunsOnTheGpu test, ctest -L '^gpu$'): every case runs the
// chapter as a user would, with --device cuda, one rank on NCCL or ranks sharing the GPU on MPI, and
// expects its verdict: PASSED, or a fault's failure named at the step the fault began. Without a usable
// GPU the test skips, saying why. COURSE_GPU_RUNS_ON=cpu runs the same cases on the CPU, on MPI: a check of
// the cases' own commands where no GPU is at hand.
#pragma once
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "common/core/device.h"
#include "support/process.h"

namespace course::testing {

struct GpuRun {
  GpuRun(std::string launch_, std::string args_, int fails_at_ = -1, std::string never_ = "")
      : launch(std::move(launch_)), args(std::move(args_)), fails_at(fails_at_), never(std::move(never_)) {}
  std::string launch;  // mpirun -np N (or a launcher that ends with what runs the chapter)
  std::string args;
  int fails_at;        // a fault begun at this step: the run must fail there, exit code 1; -1: must pass
  std::string never;   // words the output must not hold (what is true on the CPU only, say)
};

inline bool gpu_runs_on_the_cpu() {
  const char* on = std::getenv("COURSE_GPU_RUNS_ON");
  return on && std::string(on) == "cpu";
}

// One rank alone owns the GPU: NCCL, where the build has it.
inline std::string one_rank_on_nccl() {
  return COURSE_HAVE_NCCL && !gpu_runs_on_the_cpu() ? " --backend nccl" : " --backend mpi";
}

inline void expect_gpu_runs(const std::string& binary, const std::vector<GpuRun>& runs) {
  std::string reason;
  if (!gpu_runs_on_the_cpu() && !cuda_usable(&reason)) GTEST_SKIP() << "no usable GPU: " << reason;
  for (const GpuRun& run : runs) {
    const std::string command =
        run.launch + " " + binary + (gpu_runs_on_the_cpu() ? " --device cpu " : " --device cuda ") + run.args;
    const ProcessResult r = run_process(command);
    if (!run.never.empty() && !gpu_runs_on_the_cpu()) {
      EXPECT_EQ(r.out.find(run.never), std::string::npos) << command << "\n" << r.out;
    }
    if (run.fails_at < 0) {
      EXPECT_EQ(r.exit_code, 0) << command << "\n" << r.out << r.err;
      EXPECT_NE(r.out.find("PASSED"), std::string::npos) << command << "\n" << r.out;
      EXPECT_EQ(r.out.find("FAILED"), std::string::npos) << command << "\n" << r.out;
    } else {
      EXPECT_EQ(r.exit_code, 1) << command << "\n" << r.out << r.err;
      EXPECT_NE(r.out.find("FAILED at step " + std::to_string(run.fails_at)), std::string::npos)
          << command << "\n" << r.out;
    }
  }
}

}  // namespace course::testing
