// Chapter 05 graded from the outside: at 2, 3 and 4 ranks every mode passes the lock-step check;
// the metrics report each mode's time split and bytes; the timeline is valid Chrome trace JSON with a
// compute and a communication lane per rank; a simulated network is labelled; the bucket sweep runs;
// bad input exits 2 with one line naming the flag.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <set>
#include <tuple>

#include "common/checkpoint/safetensors.h"
#include "support/gpu_runs.h"
#include "support/process.h"

namespace course::testing {
namespace {

const std::string kBinary = CHAPTER05_BINARY;
const std::string kSmall = " --device cpu --layers 4 --hidden 128 --features 16 --samples 512 --global-batch 48 --steps 4";

TEST(Chapter05, EveryModePassesAtTwoThreeAndFourRanks) {
  for (const std::string& mpirun : {std::string(MPIRUN_NP2), std::string(MPIRUN_NP3), std::string(MPIRUN_NP4)}) {
    std::string metrics = temp_path("ch05.jsonl"), trace = temp_path("ch05_trace.json");
    auto r = run_process(mpirun + " " + kBinary + kSmall + " --verify --bucket-mb 0.05 --first-bucket-mb 0.01" +
                         " --metrics " + metrics + " --trace " + trace);
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
    auto records = read_metrics(metrics);
    auto modes = events(records, "mode");
    ASSERT_EQ(modes.size(), 4u);
    std::vector<std::string> names;
    for (auto& m : modes) {
      names.push_back(m["mode"]);
      EXPECT_TRUE(m["passed"].get<bool>()) << m.dump();
      EXPECT_LE(m["gradient_bound_ratio"].get<double>(), 1.0) << m.dump();
      // The step's parts are measured, not defined: communication that overlap did not hide is part of
      // the step, never more than it, and some of the step is always compute.
      EXPECT_GT(m["exposed_ms"].get<double>(), 0.0) << m.dump();
      EXPECT_LT(m["exposed_ms"].get<double>(), m["step_ms"].get<double>()) << m.dump();
      EXPECT_EQ(m["bytes_per_step"], modes[0]["bytes_per_step"]) << "every mode sends the whole gradient once";
    }
    EXPECT_EQ(names, (std::vector<std::string>{"per-parameter", "flat", "buckets", "buckets+overlap"}));
    EXPECT_EQ(modes[0]["buckets"].get<int>(), 10);  // chapter 04: one message per gradient, 5 layers x 2
    EXPECT_EQ(modes[1]["buckets"].get<int>(), 1);
    EXPECT_GT(modes[3]["buckets"].get<int>(), 2);
    // The trace: complete events on a compute and a communication lane for every rank.
    auto doc = nlohmann::json::parse(read_file(trace));
    std::set<std::pair<int, int>> lanes;
    for (auto& e : doc["traceEvents"])
      if (e["ph"] == "X") {
        EXPECT_GE(e["dur"].get<double>(), 0.0);
        lanes.insert({e["pid"].get<int>(), e["tid"].get<int>()});
      }
    const int ranks = events(records, "overlap_summary").at(0)["ranks"];
    EXPECT_EQ(static_cast<int>(lanes.size()), 2 * ranks);
  }
}

// Each bucket fault, from the first step at 2 ranks and from a late step at 3: every mode fails at
// the step the fault begins, and says what differed.
TEST(Chapter05, VerifyCatchesEveryBucketFaultAtTheStepItBegins) {
  for (const std::string fault : {"skip-bucket", "launch-early", "step-early"})
    for (const auto& [mpirun, from] : std::vector<std::pair<std::string, int>>{{MPIRUN_NP2, 0}, {MPIRUN_NP3, 9}}) {
      std::string metrics = temp_path("ch05_fault.jsonl");
      auto r = run_process(mpirun + " " + kBinary +
                           " --device cpu --layers 4 --hidden 128 --features 16 --samples 512 --global-batch 48"
                           " --steps 12 --bucket-mb 0.05 --first-bucket-mb 0.01 --verify" +
                           " --fault " + fault + " --fault-from-step " + std::to_string(from) + " --metrics " + metrics);
      EXPECT_EQ(r.exit_code, 1) << fault << "\n" << r.out << r.err;
      auto modes = events(read_metrics(metrics), "mode");
      ASSERT_EQ(modes.size(), 4u) << fault;
      for (auto& m : modes) {
        EXPECT_FALSE(m["passed"].get<bool>()) << fault << " " << m["mode"];
        EXPECT_EQ(m["first_failed_step"].get<int>(), from) << fault << " " << m["mode"];
      }
      EXPECT_NE(r.out.find("FAILED at step " + std::to_string(from)), std::string::npos) << r.out;
    }
}

// A sampler bug the run and its reference share (--fault skewed-share, at 3 ranks or more): every mode
// fails at its step on the data order, from the first step and from a late one.
TEST(Chapter05, ASamplerBugTheReferenceSharesFailsAtItsStep) {
  for (const auto& [mpirun, from] : std::vector<std::pair<std::string, int>>{{MPIRUN_NP3, 0}, {MPIRUN_NP4, 3}}) {
    std::string metrics = temp_path("ch05_sampler.jsonl");
    auto r = run_process(mpirun + " " + kBinary + kSmall + " --verify --fault skewed-share --fault-from-step " +
                         std::to_string(from) + " --metrics " + metrics);
    EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
    auto modes = events(read_metrics(metrics), "mode");
    ASSERT_EQ(modes.size(), 4u) << r.out;
    for (auto& m : modes) EXPECT_EQ(m["first_failed_step"].get<int>(), from) << m["mode"];
    EXPECT_NE(r.out.find("FAILED at step " + std::to_string(from)), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("  the data order: sample "), std::string::npos) << r.out;
  }
}

// A bug in a 16-bit kernel the reference's shares repeat (--fault truncating-gelu, ce-next-row) fails at
// its step in every mode against the shares computed without a 16-bit kernel.
TEST(Chapter05, ABugInASixteenBitKernelFailsAtItsStep) {
  for (const auto& [mpirun, flags, from] : std::vector<std::tuple<std::string, std::string, int>>{
           {MPIRUN_NP2, "--precision bf16 --fault truncating-gelu", 0}, {MPIRUN_NP3, "--precision fp16 --fault ce-next-row", 3}}) {
    std::string metrics = temp_path("ch05_kernel.jsonl");
    auto r = run_process(mpirun + " " + kBinary + " --device cpu --model gpt --n-layer 1 --n-embd 16 --n-head 2 --global-batch 24"
                         " --steps 4 --verify " + flags + " --fault-from-step " + std::to_string(from) + " --metrics " + metrics);
    EXPECT_EQ(r.exit_code, 1) << flags << "\n" << r.out << r.err;
    auto modes = events(read_metrics(metrics), "mode");
    ASSERT_EQ(modes.size(), 4u) << r.out;
    for (auto& m : modes) EXPECT_EQ(m["first_failed_step"].get<int>(), from) << m["mode"];
    EXPECT_NE(r.out.find("  the 16-bit kernels' gradient of"), std::string::npos) << r.out;
  }
}

// A bf16 hook whose conversion truncates stays within the elementwise bound of a 16-bit sum at every
// step (each element errs by less than a unit in the last place); its errors all lean toward zero, which
// rounding to nearest never does over 10^5 elements (verify::RoundingBias). From the first step at 2
// ranks and from a late one at 3 and 4, in float32 and in bf16, every mode fails at the step it begins;
// correct runs pass (SixteenBitHooksPassWithinTheirBoundAndHalveTheBytes). (In bf16 at 2 or 4 ranks
// there is nothing to truncate: the matrix products' gradients are bf16 values, and a power-of-two
// division keeps them so.)
TEST(Chapter05, VerifyCatchesATruncatingHookAtTheStepItBegins) {
  const std::string sizes = " --device cpu --layers 4 --hidden 256 --features 16 --samples 512 --global-batch 48"
                            " --steps 12 --verify --comm-hook bf16";
  for (const auto& [mpirun, from, precision] : std::vector<std::tuple<std::string, int, std::string>>{
           {MPIRUN_NP2, 0, "fp32"}, {MPIRUN_NP3, 9, "bf16"}, {MPIRUN_NP4, 11, "fp32"}}) {
    std::string metrics = temp_path("ch05_truncating.jsonl");
    auto r = run_process(mpirun + " " + kBinary + sizes + " --precision " + precision +
                         " --fault truncating-hook --fault-from-step " + std::to_string(from) + " --metrics " + metrics);
    EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
    auto modes = events(read_metrics(metrics), "mode");
    ASSERT_EQ(modes.size(), 4u) << r.out << r.err;
    for (auto& m : modes) {
      EXPECT_FALSE(m["passed"].get<bool>()) << m.dump();
      EXPECT_EQ(m["first_failed_step"].get<int>(), from) << m.dump();
      EXPECT_LE(m["gradient_bound_ratio"].get<double>(), 1.0) << "within the elementwise bound: " << m.dump();
      EXPECT_GT(m["rounding_bias_ratio"].get<double>(), 1.0) << m.dump();
    }
    EXPECT_NE(r.out.find("errs toward zero"), std::string::npos) << r.out;
  }
}

// An unwritable --trace is refused when the flags are read, by every rank alike, before any training
// (not found by rank 0 alone after it, while the others wait in a collective); no trace is written
// unless asked, so nothing lands in the current folder.
TEST(Chapter05, AnUnwritableTraceIsRefusedBeforeTraining) {
  auto r = run_process(std::string(MPIRUN_NP2) + " " + kBinary + kSmall + " --trace /nonexistent/trace.json");
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("--trace: /nonexistent/trace.json"), std::string::npos) << r.err;
  int error_lines = 0;  // one, from one rank (mpirun adds its own lines about the exit code)
  for (std::size_t at = r.err.find("error:"); at != std::string::npos; at = r.err.find("error:", at + 1)) ++error_lines;
  EXPECT_EQ(error_lines, 1) << r.err;
  EXPECT_EQ(r.out.find("mode "), std::string::npos) << "trained before refusing:\n" << r.out;
  // A trace that cannot be written in full (a full disk) is an error, not a PASSED run: said once, every
  // rank ending with it (no rank aborting the job while the others finish).
  auto full = run_process(std::string(MPIRUN_NP2) + " " + kBinary + kSmall + " --trace /dev/full");
  EXPECT_EQ(full.exit_code, 1) << full.out << full.err;
  EXPECT_NE(full.err.find("error: --trace: /dev/full: the trace could not be written"), std::string::npos) << full.err;
  EXPECT_EQ(full.err.find("MPI_ABORT"), std::string::npos) << full.err;
  const auto here = std::filesystem::current_path();
  const auto scratch = std::filesystem::temp_directory_path() / ("ch05_cwd_" + std::to_string(::getpid()));
  std::filesystem::create_directories(scratch);
  std::filesystem::current_path(scratch);
  auto plain = run_process(std::string(MPIRUN_NP2) + " " + kBinary + kSmall);
  std::filesystem::current_path(here);
  EXPECT_EQ(plain.exit_code, 0) << plain.out << plain.err;
  EXPECT_TRUE(std::filesystem::is_empty(scratch)) << "wrote into the current folder";
  std::filesystem::remove_all(scratch);
}

TEST(Chapter05, SimulatedNetworkIsLabelledAndTheSweepRuns) {
  std::string metrics = temp_path("ch05_sim.jsonl"), trace = temp_path("ch05_sim.json");
  auto r = run_process(std::string(MPIRUN_NP2) + " " + kBinary + kSmall + " --sim-network 10,1.25 --sweep-buckets" +
                       " --metrics " + metrics + " --trace " + trace);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("(simulated network: alpha 10 us, 1.25 GB/s)"), std::string::npos) << r.out;
  auto records = read_metrics(metrics);
  EXPECT_EQ(events(records, "bucket_sweep").size(), 9u);
  for (auto& m : events(records, "mode")) EXPECT_NE(m["simulated_network"].get<std::string>(), "");
  EXPECT_NE(read_file(trace).find("simulated network"), std::string::npos);
}

TEST(Chapter05, SixteenBitHooksPassWithinTheirBoundAndHalveTheBytes) {
  std::map<std::string, double> bytes;
  for (const std::string hook : {"none", "fp16", "bf16"}) {
    std::string metrics = temp_path("ch05_hook.jsonl"), trace = temp_path("ch05_hook.json");
    auto r = run_process(std::string(MPIRUN_NP2) + " " + kBinary + kSmall + " --verify --comm-hook " + hook +
                         " --metrics " + metrics + " --trace " + trace);
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
    for (auto& m : events(read_metrics(metrics), "mode")) {
      EXPECT_TRUE(m["passed"].get<bool>()) << hook << " " << m.dump();
      EXPECT_EQ(m["comm_hook"], hook);
      // Rounding to nearest leans neither way: a small fraction of the threshold (verify::RoundingBias),
      // measured in 16 bits only.
      const double lean = m["rounding_bias_ratio"].get<double>();
      if (hook == "none") EXPECT_EQ(lean, 0.0) << m.dump();
      else EXPECT_TRUE(lean > 0.0 && lean < 0.5) << hook << " " << m.dump();
      bytes[hook] = m["bytes_per_step"].get<double>();
    }
  }
  EXPECT_NEAR(bytes["fp16"], bytes["none"] / 2, 16);
  EXPECT_NEAR(bytes["bf16"], bytes["none"] / 2, 16);
}

TEST(Chapter05, EveryModePassesWithTheGpt) {
  std::string metrics = temp_path("ch05_gpt.jsonl");
  auto r = run_process(std::string(MPIRUN_NP2) + " " + kBinary +
                       " --device cpu --model gpt --n-layer 1 --n-embd 32 --global-batch 32 --steps 4 --verify --trace " +
                       temp_path("ch05_gpt_trace.json") + " --metrics " + metrics);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  auto modes = events(read_metrics(metrics), "mode");
  ASSERT_EQ(modes.size(), 4u);
  for (auto& m : modes) {
    EXPECT_TRUE(m["passed"].get<bool>()) << m["mode"];
    EXPECT_LE(m["gradient_bound_ratio"].get<double>(), 1.0) << m["mode"];
  }
  // Per parameter: one bucket for each of the GPT's 16 parameters, the tied token table once.
  EXPECT_EQ(modes[0]["buckets"].get<int>(), 16);
}

// --precision bf16 and fp16 (float32 masters, the forward under autocast, fp16's loss scale): every mode
// passes the lock-step check against one rank of the same precision, with and without a 16-bit hook on
// top, and a bucket fault that begins late is caught at its step in every mode.
TEST(Chapter05, MixedPrecisionPassesInEveryModeAndAFaultIsCaught) {
  const std::string model = " --device cpu --model gpt --n-layer 1 --n-embd 32 --global-batch 48 --steps 6 --verify ";
  for (const auto& [mpirun, flags] : std::vector<std::pair<std::string, std::string>>{
           {MPIRUN_NP3, "--precision bf16"}, {MPIRUN_NP2, "--precision fp16 --comm-hook bf16"}}) {
    std::string metrics = temp_path("ch05_mixed.jsonl");
    auto r = run_process(mpirun + " " + kBinary + model + flags + " --metrics " + metrics);
    ASSERT_EQ(r.exit_code, 0) << flags << r.out << r.err;
    EXPECT_NE(r.out.find("mixed precision"), std::string::npos) << r.out;
    auto modes = events(read_metrics(metrics), "mode");
    ASSERT_EQ(modes.size(), 4u);
    for (auto& m : modes) EXPECT_TRUE(m["passed"].get<bool>()) << flags << " " << m["mode"];
  }
  auto r = run_process(std::string(MPIRUN_NP3) + " " + kBinary + model + "--precision bf16 --fault skip-bucket --fault-from-step 4");
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_NE(r.out.find("buckets+overlap         1"), std::string::npos) << r.out;
  std::size_t failed_at_4 = 0;
  for (std::size_t at = r.out.find("FAILED at step 4"); at != std::string::npos; at = r.out.find("FAILED at step 4", at + 1))
    ++failed_at_4;
  EXPECT_EQ(failed_at_4, 4u) << r.out;  // every mode
}

TEST(Chapter05, SavesTheFinalParametersAsSafetensors) {
  std::string saved = temp_path("ch05.safetensors");
  auto r = run_process(std::string(MPIRUN_NP2) + " " + kBinary + kSmall + " --save " + saved);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  auto loaded = checkpoint::load_safetensors(saved);
  // --layers 4 --hidden 128 --features 16: five linear layers, a weight and a bias each.
  ASSERT_EQ(loaded.tensors.size(), 10u);
  EXPECT_EQ(loaded.tensors.front().first, "0.weight");
  EXPECT_EQ(loaded.tensors.front().second.shape(), (Shape{128, 16}));  // PyTorch's Linear: [out, in]
  EXPECT_EQ(loaded.metadata.at("mode"), "buckets+overlap");
  std::remove(saved.c_str());
  auto bad = run_process(kBinary + " --save /nonexistent/folder/x.safetensors");
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.err.find("--save"), std::string::npos) << bad.err;
}

// The defaults run at any world size: the default global batch (128) is rounded up to a multiple of the
// ranks and the log says so; the same number given as a flag is the user's, and is refused.
TEST(Chapter05, TheDefaultGlobalBatchRunsAtThreeRanks) {
  const std::string sizes = " --device cpu --layers 2 --hidden 32 --features 8 --samples 512 --steps 2";
  auto r = run_process(std::string(MPIRUN_NP3) + " " + kBinary + sizes);
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("global batch 129: the default 128 rounded up to a multiple of 3 ranks"), std::string::npos) << r.out;
  auto given = run_process(std::string(MPIRUN_NP3) + " " + kBinary + sizes + " --global-batch 128");
  EXPECT_EQ(given.exit_code, 2) << given.out << given.err;
  EXPECT_NE(given.err.find("--global-batch: 128 is not divisible by 3 ranks"), std::string::npos) << given.err;
}

TEST(Chapter05, BadInput) {
  for (auto& [args, flag] : std::vector<std::pair<std::string, std::string>>{
           {"--bucket-mb 0", "--bucket-mb"},          {"--bucket-mb -1", "--bucket-mb"},
           {"--bucket-mb nan", "--bucket-mb"},        {"--first-bucket-mb 0", "--first-bucket-mb"},
           {"--sim-network 1,0", "--sim-network"},    {"--sim-network fast", "--sim-network"},
           {"--sim-network 10,nan", "--sim-network"}, {"--steps 1", "--steps"},
           {"--global-batch 8192", "--global-batch"}, {"--hidden 0", "--hidden"},
           {"--comm-hook xyz", "--comm-hook"},        {"--fault skip-bucket", "--fault"},  // nothing to catch it
           {"--verify --fault truncating-hook --comm-hook fp16", "--comm-hook"}}) {  // a fault of the bf16 hook
    auto r = run_process(kBinary + " --device cpu " + args);
    EXPECT_EQ(r.exit_code, 2) << args << ": " << r.err;
    EXPECT_EQ(count_lines(r.err), 1) << args << ": " << r.err;
    EXPECT_NE(r.err.find(flag), std::string::npos) << args << ": " << r.err;
  }
}

// On a GPU: every mode in lock-step, one rank on NCCL and two or three sharing the GPU on MPI, fp32 and
// bf16, and a bucket skipped from a late step caught at that step. What the chapter says of its overlap
// is what is true on a GPU, never the CPU's explanation.
TEST(Chapter05, RunsOnTheGpuInLockStep) {
  const std::string small = " --layers 4 --hidden 128 --features 16 --samples 512 --global-batch 48"
                            " --bucket-mb 0.05 --first-bucket-mb 0.01 --verify";
  const std::string cpu_words = "the transfer itself takes the CPU";
  expect_gpu_runs(kBinary, {{MPIRUN_NP1, one_rank_on_nccl() + small + " --steps 4", -1, cpu_words},
                            {MPIRUN_NP2, "--backend mpi" + small + " --steps 4", -1, cpu_words},
                            {MPIRUN_NP2, "--backend mpi" + small + " --steps 4 --precision bf16 --model gpt --n-layer 1"},
                            {MPIRUN_NP3, "--backend mpi" + small + " --steps 12 --fault skip-bucket --fault-from-step 9", 9}});
}

}  // namespace
}  // namespace course::testing
