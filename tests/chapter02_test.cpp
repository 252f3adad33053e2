// Chapter 02 graded from the outside: accumulation equals the big batch, with a partial last batch,
// uses less activation memory, and rejects bad input.
#include <gtest/gtest.h>

#include "common/core/device.h"
#include "support/process.h"

namespace course::testing {
namespace {

const std::string kBinary = CHAPTER02_BINARY;
// Two summation orders of the same training drift apart by the order of the noise floor (the big
// batch against itself summed in reverse); a wrong accumulation (an unscaled or lost micro-batch)
// moves the weights by orders of magnitude more.
constexpr double kDriftFactor = 100;

nlohmann::json run_ok(const std::string& args) {
  std::string metrics = temp_path("ch02.jsonl");
  auto r = run_process(kBinary + " " + args + " --metrics " + metrics);
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("PASSED"), std::string::npos) << r.out;
  auto records = events(read_metrics(metrics), "accumulation");
  EXPECT_EQ(records.size(), 1u);
  return records.empty() ? nlohmann::json{} : records[0];
}

TEST(Chapter02, AccumulationEqualsOneBigBatch) {
  auto m = run_ok("--device cpu");
  EXPECT_TRUE(m["passed"].get<bool>());
  EXPECT_TRUE(m["lockstep_passed"].get<bool>());
  EXPECT_EQ(m["first_failed_step"].get<int>(), -1);
  EXPECT_LE(m["gradient_bound_ratio"].get<double>(), 1.0);
  EXPECT_GT(m["noise_floor"].get<double>(), 0.0);
  EXPECT_LE(m["max_weight_diff"].get<double>(), kDriftFactor * m["noise_floor"].get<double>());
  EXPECT_GT(m["optimizer_steps"].get<int>(), 0);
}

TEST(Chapter02, PartialLastBatchIsIncluded) {
  // 1003 = 28 * 35 + 23: 29 steps an epoch, the last with 4 full micro-batches of 5 and one of 3.
  auto m = run_ok("--device cpu --samples 1003 --micro-batch 5 --accum 7 --epochs 2");
  EXPECT_EQ(m["optimizer_steps"].get<int>(), 2 * 29);
  EXPECT_TRUE(m["passed"].get<bool>());
}

TEST(Chapter02, AccumulationNeedsLessActivationMemory) {
  auto m = run_ok("--device cpu --micro-batch 8 --accum 8");
  EXPECT_LT(2 * m["peak_activation_bytes_accumulated"].get<long>(), m["peak_activation_bytes_big_batch"].get<long>());
}

// Mixed precision is chapter 04's lesson: this chapter's loop is plain float32 SGD, and its flags are
// refused with one line that names them rather than accepted and ignored.
TEST(Chapter02, MixedPrecisionIsChapter04s) {
  for (const std::string flag : {"--precision bf16", "--loss-scale 1024", "--tf32"}) {
    auto r = run_process(kBinary + " --device cpu " + flag);
    EXPECT_EQ(r.exit_code, 2) << flag << r.out << r.err;
    EXPECT_NE(r.err.find(flag.substr(0, flag.find(' '))), std::string::npos) << r.err;
  }
}

TEST(Chapter02, RunsOnTheGpuWhenOneIsUsable) {
  std::string reason;
  if (!cuda_usable(&reason)) GTEST_SKIP() << "no usable GPU: " << reason;
  auto m = run_ok("--device cuda");
  EXPECT_EQ(m["device"], "cuda");
}

TEST(Chapter02, HelpAndBadInput) {
  auto help = run_process(kBinary + " --help");
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_NE(help.out.find("--accum"), std::string::npos);
  for (auto [args, flag] : std::vector<std::pair<std::string, std::string>>{
           {"--accum 0", "--accum"}, {"--micro-batch -1", "--micro-batch"}, {"--lr nan", "--lr"},
           {"--device gpu0", "--device"}, {"--metrics /proc/nope/x", "--metrics"}}) {
    auto r = run_process(kBinary + " " + args);
    EXPECT_EQ(r.exit_code, 2) << args;
    EXPECT_EQ(count_lines(r.err), 1) << r.err;
    EXPECT_NE(r.err.find(flag), std::string::npos) << r.err;
  }
}

}  // namespace
}  // namespace course::testing
