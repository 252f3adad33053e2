// Chapter 01 graded from the outside: the worked example against the hand-derived formulas,
// training that converges to the true weights, the MLP mode, --help, and bad input.
#include <gtest/gtest.h>

#include "common/core/device.h"
#include "common/data/house_prices.h"
#include <ostream>
#include <sstream>

#include "support/process.h"

namespace course::testing {
namespace {

const std::string kBinary = CHAPTER01_BINARY;
// A 1000-sample run with noise 0.1 settles within a few hundredths of the true weights.
constexpr double kWeightTolerance = 0.05;

TEST(Chapter01, WorkedExampleMatchesHandDerivation) {
  std::string metrics = temp_path("ch01_worked.jsonl");
  auto r = run_process(kBinary + " --device cpu --metrics " + metrics);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto steps = events(read_metrics(metrics), "worked_step");
  ASSERT_EQ(steps.size(), 2u);
  // By hand: y_pred = w1 x1 + w2 x2 + b; L = (y_pred - y)^2; dL/dw_i = 2 (y_pred - y) x_i; dL/db = 2 (y_pred - y).
  double w1 = 1, w2 = 1, b = 0, lr = 1e-3;
  const double xs[2][2] = {{6, 2}, {5, 2}}, ys[2] = {15, 12};
  for (int s = 0; s < 2; ++s) {
    double pred = w1 * xs[s][0] + w2 * xs[s][1] + b, e = pred - ys[s];
    double g1 = 2 * e * xs[s][0], g2 = 2 * e * xs[s][1], gb = 2 * e;
    EXPECT_NEAR(steps[s]["prediction"].get<double>(), pred, 1e-5);
    EXPECT_NEAR(steps[s]["loss"].get<double>(), e * e, 1e-4);
    EXPECT_NEAR(steps[s]["grad_w"][0].get<double>(), g1, 1e-4);
    EXPECT_NEAR(steps[s]["grad_w"][1].get<double>(), g2, 1e-4);
    EXPECT_NEAR(steps[s]["grad_b"].get<double>(), gb, 1e-5);
    // Exercise 01.1, gradient_by_hand: the chain rule's three numbers, as the run prints them.
    ASSERT_EQ(steps[s]["grad_by_hand"].size(), 3u) << "gradient_by_hand returns {dL/dw1, dL/dw2, dL/db}";
    EXPECT_NEAR(steps[s]["grad_by_hand"][0].get<double>(), g1, 1e-4) << "dL/dw1 = 2 (y_pred - y) x1";
    EXPECT_NEAR(steps[s]["grad_by_hand"][1].get<double>(), g2, 1e-4) << "dL/dw2 = 2 (y_pred - y) x2";
    EXPECT_NEAR(steps[s]["grad_by_hand"][2].get<double>(), gb, 1e-5) << "dL/db = 2 (y_pred - y)";
    w1 -= lr * g1, w2 -= lr * g2, b -= lr * gb;
    EXPECT_NEAR(steps[s]["w"][0].get<double>(), w1, 1e-6);
    EXPECT_NEAR(steps[s]["w"][1].get<double>(), w2, 1e-6);
    EXPECT_NEAR(steps[s]["b"].get<double>(), b, 1e-6);
  }
  EXPECT_NEAR(w1, 1.1291, 1e-9);  // the example's printed result, for the reader
}

TEST(Chapter01, LossFallsAndWeightsApproachTheTruth) {
  std::string metrics = temp_path("ch01_train.jsonl");
  auto r = run_process(kBinary + " --device cpu --epochs 5 --metrics " + metrics);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto records = read_metrics(metrics);
  auto epochs = events(records, "epoch");
  ASSERT_EQ(epochs.size(), 6u);
  EXPECT_LT(epochs.back()["loss"].get<double>(), 0.01 * epochs.front()["loss"].get<double>());
  auto final_record = events(records, "final").at(0);
  EXPECT_NEAR(final_record["weights"][0].get<double>(), data::kTrueBedroomWeight, kWeightTolerance);
  EXPECT_NEAR(final_record["weights"][1].get<double>(), data::kTrueBathroomWeight, kWeightTolerance);
  EXPECT_NEAR(final_record["bias"].get<double>(), data::kTrueBias, kWeightTolerance);
  EXPECT_NE(r.out.find("learned: w1 ="), std::string::npos);
}

TEST(Chapter01, MlpModeTrainsAndReportsThroughput) {
  std::string metrics = temp_path("ch01_mlp.jsonl");
  auto r = run_process(kBinary + " --device cpu --model mlp --hidden 32 --layers 2 --batch-size 64 --samples 2048 "
                       "--epochs 3 --metrics " + metrics);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto records = read_metrics(metrics);
  auto epochs = events(records, "epoch");
  EXPECT_LT(epochs.back()["loss"].get<double>(), 0.5 * epochs.front()["loss"].get<double>());
  EXPECT_GT(events(records, "final").at(0)["samples_per_s"].get<double>(), 0.0);
}

// Mixed precision is chapter 04's lesson: this chapter's loop is plain float32 SGD, and its flag is refused
// with one line that names it rather than accepted and ignored.
TEST(Chapter01, MixedPrecisionIsChapter04s) {
  for (const std::string flag : {"--precision bf16", "--loss-scale 1024", "--tf32"}) {
    auto r = run_process(kBinary + " --device cpu " + flag);
    EXPECT_EQ(r.exit_code, 2) << flag << r.out << r.err;
    EXPECT_NE(r.err.find(flag.substr(0, flag.find(' '))), std::string::npos) << r.err;
  }
}

TEST(Chapter01, RunsOnTheGpuWhenOneIsUsable) {
  std::string reason;
  if (!cuda_usable(&reason)) GTEST_SKIP() << "no usable GPU: " << reason;
  std::string metrics = temp_path("ch01_gpu.jsonl");
  auto r = run_process(kBinary + " --device cuda --epochs 3 --metrics " + metrics);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto final_record = events(read_metrics(metrics), "final").at(0);
  EXPECT_EQ(final_record["device"], "cuda");
  EXPECT_NEAR(final_record["weights"][0].get<double>(), data::kTrueBedroomWeight, kWeightTolerance);
}

// cuBLAS is opened at the first GEMM on a GPU (common/kernels/cublas_library.h), not with the program:
// linked, it cost every process 55 ms of start-up (libcublasLt's initialisers), --help and runs on the
// CPU included. The loader's own log (LD_DEBUG=files) names every library a process loads or opens.
TEST(Chapter01, StartsAndTrainsOnTheCpuWithoutOpeningCublas) {
  if (!COURSE_HAVE_CUDA) GTEST_SKIP() << "this build has no CUDA backend: cuBLAS is not part of it";
  for (const std::string args : {" --help", " --device cpu"}) {
    auto r = run_process("LD_DEBUG=files " + kBinary + args);
    ASSERT_EQ(r.exit_code, 0) << args << "\n" << r.out;
    EXPECT_NE(r.err.find("libcudart"), std::string::npos) << "the loader's log names no CUDA library";
    const auto cublas = r.err.find("libcublas");
    EXPECT_EQ(cublas, std::string::npos) << args << ": cuBLAS was loaded: "
                                         << r.err.substr(cublas == std::string::npos ? 0 : cublas, 200);
  }
}

TEST(Chapter01, ReadmeOutputIsWhatTheProgramPrints) {
  // Every line of the README's expected-output block (except "...") must be printed by the run it documents.
  std::istringstream readme(read_file(CHAPTER01_README));
  std::vector<std::string> expected;
  bool in_block = false, after_heading = false;
  for (std::string line; std::getline(readme, line);) {
    if (line.rfind("Expected output", 0) == 0) after_heading = true;
    else if (after_heading && line.rfind("```", 0) == 0) {
      if (in_block) break;
      in_block = true;
    } else if (in_block && line != "...") {
      expected.push_back(line);
    }
  }
  ASSERT_GE(expected.size(), 5u) << "no expected-output block found in the README";
  auto r = run_process(kBinary + " --device cpu");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const auto& line : expected) EXPECT_NE(r.out.find(line + "\n"), std::string::npos) << "README line not printed: " << line;
}

TEST(Chapter01, HelpWorks) {
  auto r = run_process(kBinary + " --help");
  EXPECT_EQ(r.exit_code, 0);
  for (const char* flag : {"--device", "--seed", "--metrics", "--model", "--batch-size", "--lr"})
    EXPECT_NE(r.out.find(flag), std::string::npos) << flag;
}

struct BadInput {
  std::string args, flag;
};
void PrintTo(const BadInput& b, std::ostream* out) { *out << b.args; }
class Chapter01BadInput : public ::testing::TestWithParam<BadInput> {};

TEST_P(Chapter01BadInput, OneLineNamingTheFlagAndExitCode2) {
  auto r = run_process(kBinary + " " + GetParam().args);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_EQ(count_lines(r.err), 1) << r.err;
  EXPECT_NE(r.err.find(GetParam().flag), std::string::npos) << r.err;
}

std::vector<BadInput> bad_inputs() {
  std::vector<BadInput> cases = {{"--batch-size 0", "--batch-size"},  {"--batch-size -4", "--batch-size"},
                                 {"--lr 0", "--lr"},                  {"--lr -0.1", "--lr"},
                                 {"--lr nan", "--lr"},                {"--device tpu", "--device"},
                                 {"--metrics /nonexistent/dir/m.jsonl", "--metrics"},
                                 {"--model transformer", "--model"},  {"--epochs 0", "--epochs"}};
  if (!cuda_usable()) cases.push_back({"--device cuda", "--device"});
  return cases;
}
INSTANTIATE_TEST_SUITE_P(Flags, Chapter01BadInput, ::testing::ValuesIn(bad_inputs()));

}  // namespace
}  // namespace course::testing
