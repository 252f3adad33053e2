// Chapter 03 graded from the outside: the binary demonstrates and benchmarks every primitive at 2
// and 4 ranks with nothing wrong, the watchdog ends a job whose ranks disagree, and bad input exits 2.
#include <gtest/gtest.h>

#include <set>

#include "common/core/device.h"
#include "support/gpu_runs.h"
#include "support/process.h"

namespace course::testing {
namespace {

const std::string kBinary = CHAPTER03_BINARY;

TEST(Chapter03, DemonstratesAndBenchmarksEveryPrimitive) {
  for (const std::string mpirun : {MPIRUN_NP2, MPIRUN_NP4}) {
    std::string metrics = temp_path("ch03.jsonl");
    auto r = run_process(mpirun + " " + kBinary + " --device cpu -b 8 -e 64K -f 32 -n 2 -w 1 --metrics " + metrics);
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
    EXPECT_NE(r.out.find("PASSED"), std::string::npos);
    auto records = read_metrics(metrics);
    auto rows = events(records, "bench");
    std::set<std::string> seen;
    for (auto& row : rows) {
      EXPECT_EQ(row["wrong"].get<long>(), 0) << row.dump();
      seen.insert(row["op"].get<std::string>() + "/" + row["algorithm"].get<std::string>());
    }
    for (const char* expected : {"all_reduce/ring", "all_reduce/tree", "all_reduce/naive", "all_reduce/mpi",
                                 "broadcast/naive", "broadcast/tree", "broadcast/mpi", "reduce/tree", "reduce/mpi",
                                 "all_gather/ring", "all_gather/mpi", "reduce_scatter/ring", "reduce_scatter/mpi"})
      EXPECT_TRUE(seen.count(expected)) << expected;
    EXPECT_EQ(events(records, "alpha_beta").size(), 1u);
    EXPECT_TRUE(events(records, "summary").at(0)["passed"].get<bool>());
    // Rank 0 alone prints: one "Backend:" line, not one per rank.
    EXPECT_EQ(r.out.find("Backend:"), r.out.rfind("Backend:"));
  }
}

TEST(Chapter03, BusBandwidthUsesTheNcclTestsFactors) {
  std::string metrics = temp_path("ch03_bus.jsonl");
  auto r = run_process(std::string(MPIRUN_NP4) + " " + kBinary + " --device cpu --mode bench -b 4K -e 4K -n 1 -w 0 --metrics " + metrics);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (auto& row : events(read_metrics(metrics), "bench")) {
    double ratio = row["busbw_gbps"].get<double>() / row["algbw_gbps"].get<double>();
    std::string op = row["op"];
    double expected = op == "all_reduce" ? 2.0 * 3 / 4 : (op == "all_gather" || op == "reduce_scatter") ? 3.0 / 4 : 1.0;
    EXPECT_NEAR(ratio, expected, 1e-9) << op;
  }
}

TEST(Chapter03, WatchdogEndsAJobWhoseRanksSkipACollective) {
  // `timeout` only guards against a broken watchdog; the watchdog itself fires after 2 s.
  auto r = run_process("timeout 120 " + std::string(MPIRUN_NP2) + " " + WATCHDOG_HELPER);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.exit_code, 124) << "the job hung: the watchdog did not fire";
  EXPECT_NE(r.err.find("all_reduce #2"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("rank 0"), std::string::npos) << r.err;
}

TEST(Chapter03, HelpAndBadInput) {
  auto help = run_process(kBinary + " --help");
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_NE(help.out.find("--backend"), std::string::npos);
  std::vector<std::pair<std::string, std::string>> cases = {
      {"-b 0", "-b"},           {"-b 7", "-b"},          {"-b 1X", "-b"},           {"-b 1M -e 1K", "-b"},
      {"-f 1", "--stepfactor"}, {"--root 5", "--root"},  {"--root -1", "--root"},   {"--backend gloo", "--backend"},
      {"--timeout 0", "--timeout"}, {"--mode fast", "--mode"}, {"--ops all_reduce,alltoall", "--ops"},
      {"-e 99999999999G", "-e"},   {"-e 64G", "-e"},         {"-e ''", "--maxbytes"},           {"--timeout 1e30", "--timeout"}};
  if (!cuda_usable()) cases.push_back({"--backend nccl", "--backend nccl"});
  // Without mpirun the program is a world of one, so --root 5 is out of range there too.
  for (auto& [args, flag] : cases) {
    auto r = run_process(kBinary + " --device cpu " + args);
    EXPECT_EQ(r.exit_code, 2) << args << ": " << r.err;
    EXPECT_EQ(count_lines(r.err), 1) << args << ": " << r.err;
    EXPECT_NE(r.err.find(flag), std::string::npos) << args << ": " << r.err;
  }
  // Under mpirun every rank rejects the flag, and rank 0 alone prints the line (mpirun adds its own
  // report of the exit code after it).
  auto r = run_process(std::string(MPIRUN_NP2) + " " + kBinary + " --device cpu --root 2");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_EQ(r.err.find("error: --root"), r.err.rfind("error: --root")) << r.err;
  EXPECT_NE(r.err.find("error: --root: 2 is out of range for 2 ranks"), std::string::npos) << r.err;
}

// On a GPU: every primitive demonstrated and benchmarked, one rank on NCCL, two sharing the GPU on MPI.
TEST(Chapter03, RunsOnTheGpuOnNcclAndOnMpi) {
  const std::string sizes = " -b 8 -e 64K -f 32 -n 2 -w 1";
  expect_gpu_runs(kBinary, {{MPIRUN_NP1, one_rank_on_nccl() + sizes}, {MPIRUN_NP2, "--backend mpi" + sizes}});
}

}  // namespace
}  // namespace course::testing
