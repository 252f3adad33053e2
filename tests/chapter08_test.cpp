// Chapter 08 graded from the outside: on every grid (TP 2 and 4; PP 2 and 4 with both schedules; DP 2
// on top of TP 2 and of PP 2; TP 2 x PP 2; 3D, DP 2 x TP 2 x PP 2 on 8 ranks; sequence parallelism at
// TP 2, TP 4 and in 3D), --verify finds every step of the split GPT, in lock-step, within its noise
// floor of the unsharded GPT, and the MLP's split in pairs of the unsharded MLP; every fault fails at
// the step it begins, from the first and from a late one of a 1000-step run; sequence parallelism holds
// fewer activations than TP alone; every stage reports its measured bubble beside
// (p-1)/(m+p-1) (timings are reported, never asserted) and 1F1B holds fewer activations than GPipe;
// interleaved 1F1B and zero bubble pass --verify and give 1F1B's losses bit for bit;
// in bf16 and fp16 every grid trains, and without tensor parallelism --verify checks them by their
// micro-batches, catching a late fault; context parallelism (ring and Ulysses) passes --verify alone and
// beside TP, PP and DP, its bytes per step its formula's, a late fault caught, and a 4096-token context
// that one rank cannot hold in 128 MiB fits at two; impossible grids and sizes are one line and exit code 2.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <tuple>

#include "support/gpu_runs.h"
#include "support/process.h"

namespace course::testing {
namespace {

const std::string kBinary = CHAPTER08_BINARY;
// 4 layers of 4 heads of 32 (divisible by 1, 2 and 4 stages and TP ranks), a short run.
const std::string kModel = " --device cpu --n-layer 4 --n-head 4 --n-embd 32 --global-batch 48";
const std::string kSmall = kModel + " --steps 6";

struct Outcome {
  ProcessResult process;
  std::vector<nlohmann::json> records;
};

Outcome run(const std::string& mpirun, const std::string& flags, const std::string& base = kSmall) {
  const std::string metrics = temp_path("ch08.jsonl");
  Outcome r;
  r.process = run_process(mpirun + " " + kBinary + base + " " + flags + " --metrics " + metrics);
  r.records = read_metrics(metrics);
  std::remove(metrics.c_str());
  return r;
}

TEST(Chapter08, EveryGridMatchesTheUnshardedGpt) {
  for (const auto& [mpirun, grid] : std::vector<std::pair<std::string, std::string>>{
           {MPIRUN_NP2, "--tp 2"},
           {MPIRUN_NP4, "--tp 4"},
           {MPIRUN_NP2, "--pp 2 --schedule gpipe"},
           {MPIRUN_NP2, "--pp 2 --schedule 1f1b"},
           {MPIRUN_NP4, "--pp 4 --schedule gpipe"},
           {MPIRUN_NP4, "--pp 4 --schedule 1f1b --micro-batches 6"},
           {MPIRUN_NP4, "--tp 2 --dp 2"},
           {MPIRUN_NP4, "--pp 2 --dp 2"},
           {MPIRUN_NP4, "--tp 2 --pp 2"},
           {MPIRUN_NP8, "--tp 2 --pp 2 --dp 2"},
           // Clipping that always acts: the global norm summed over the grid, each part once.
           {MPIRUN_NP8, "--tp 2 --pp 2 --dp 2 --clip 0.1"},
           // Sequence parallelism: the layer norms on shards of the sequence, alone and inside 3D.
           {MPIRUN_NP2, "--tp 2 --sequence-parallel"},
           {MPIRUN_NP4, "--tp 4 --sequence-parallel"},
           {MPIRUN_NP8, "--tp 2 --pp 2 --dp 2 --sequence-parallel"}}) {
    Outcome r = run(mpirun, grid + " --verify");
    ASSERT_EQ(r.process.exit_code, 0) << grid << "\n" << r.process.out << r.process.err;
    auto verify = events(r.records, "verify");
    ASSERT_EQ(verify.size(), 1u) << grid;
    EXPECT_TRUE(verify[0]["passed"].get<bool>()) << grid;
    EXPECT_GT(verify[0]["noise_floor"].get<double>(), 0.0) << grid;  // the noise floor was measured
    EXPECT_EQ(verify[0]["steps"].get<int>(), 6) << grid;
  }
}

// Context parallelism, both methods, alone and beside every other dimension (TP, PP with both 1F1B
// schedules, DP; three of the four at 8 ranks): --verify passes in lock-step against the unsharded GPT,
// and what attention hands the CP group per step is its method's formula exactly. At 3 ranks the
// 8-token problems are padded to 12 (the ring's 6 chunks) or 9 (Ulysses' 3 shards, 3 heads).
TEST(Chapter08, ContextParallelismPassesVerifyOnEveryGridAndSendsItsFormulasBytes) {
  const std::string three_heads = " --device cpu --n-layer 4 --n-head 3 --n-embd 24 --global-batch 48 --steps 6";
  for (const auto& [mpirun, grid, base] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {MPIRUN_NP2, "--cp 2", kSmall},
           {MPIRUN_NP2, "--cp 2 --cp-method ulysses", kSmall},
           {MPIRUN_NP3, "--cp 3", kSmall},
           {MPIRUN_NP3, "--cp 3 --cp-method ulysses", three_heads},
           {MPIRUN_NP4, "--cp 4 --recompute full", kSmall},
           {MPIRUN_NP4, "--tp 2 --cp 2 --cp-method ulysses", kSmall},
           {MPIRUN_NP4, "--pp 2 --cp 2 --schedule interleaved --virtual-stages 2", kSmall},
           {MPIRUN_NP4, "--dp 2 --cp 2", kSmall},
           {MPIRUN_NP8, "--tp 2 --cp 2 --pp 2", kSmall},
           {MPIRUN_NP8, "--dp 2 --cp 2 --pp 2 --cp-method ulysses", kSmall}}) {
    Outcome r = run(mpirun, grid + " --verify", base);
    ASSERT_EQ(r.process.exit_code, 0) << grid << "\n" << r.process.out << r.process.err;
    auto verify = events(r.records, "verify");
    ASSERT_EQ(verify.size(), 1u) << grid;
    EXPECT_TRUE(verify[0]["passed"].get<bool>()) << grid;
    EXPECT_EQ(verify[0]["steps"].get<int>(), 6) << grid;
    auto cp = events(r.records, "context_parallel");
    ASSERT_EQ(cp.size(), 1u) << grid << r.process.out;
    EXPECT_GT(cp[0]["bytes_per_step"].get<std::int64_t>(), 0) << grid;
    EXPECT_EQ(cp[0]["bytes_per_step"].get<std::int64_t>(), cp[0]["formula_bytes_per_step"].get<std::int64_t>()) << grid;
  }
}

// A 4096-token context (windows of a text) under a budget of 128 MiB per rank: one rank would hold
// attention's 4096 x 4096 probabilities per head and runs out of memory; the ring at 2 ranks keeps no
// probabilities, fits, and passes --verify against the unsharded GPT (whose memory is the check's).
TEST(Chapter08, ALongContextFitsTheBudgetOnlyWithContextParallelism) {
  const std::string text = temp_path("ch08_long.txt");
  {
    std::ofstream out(text);
    for (int i = 0; i < 400; ++i) out << "line " << i << ": the quick brown fox jumps over the lazy dog.\n";
  }
  const std::string flags = " --device cpu --data " + text + " --val-fraction 0.25 --block-size 4096 --n-layer 1 "
                            "--n-head 4 --n-embd 32 --global-batch 2 --micro-batches 1 --steps 2 --mem-limit-mb 128";
  auto alone = run_process(std::string(MPIRUN_NP1) + " " + kBinary + flags);
  EXPECT_NE(alone.exit_code, 0) << alone.out;
  EXPECT_NE((alone.out + alone.err).find("out of memory: needs"), std::string::npos) << alone.out << alone.err;
  Outcome ring = run(MPIRUN_NP2, flags + " --cp 2 --verify", "");
  EXPECT_EQ(ring.process.exit_code, 0) << ring.process.out << ring.process.err;
  auto activations = events(ring.records, "activations");
  ASSERT_EQ(activations.size(), 1u) << ring.process.out;
  EXPECT_LT(activations[0]["peak_activation_bytes"].get<double>(), 32.0 * 1024 * 1024);
  auto verify = events(ring.records, "verify");
  ASSERT_EQ(verify.size(), 1u) << ring.process.out;
  EXPECT_TRUE(verify[0]["passed"].get<bool>());
  std::remove(text.c_str());
}

// The house-price MLP, its linear layers split in column-then-row pairs, with replicas on top.
TEST(Chapter08, TheMlpSplitInPairsMatchesTheUnshardedMlp) {
  for (const auto& [mpirun, grid] : std::vector<std::pair<std::string, std::string>>{
           {MPIRUN_NP2, "--tp 2"}, {MPIRUN_NP4, "--tp 4"}, {MPIRUN_NP4, "--tp 2 --dp 2"}}) {
    Outcome r = run(mpirun, "--model mlp " + grid + " --verify");
    ASSERT_EQ(r.process.exit_code, 0) << grid << "\n" << r.process.out << r.process.err;
    auto verify = events(r.records, "verify");
    ASSERT_EQ(verify.size(), 1u) << grid;
    EXPECT_TRUE(verify[0]["passed"].get<bool>()) << grid;
    EXPECT_NE(r.process.out.find("unsharded MLP"), std::string::npos) << r.process.out;
  }
}

// Sequence parallelism keeps each rank's shard of the layer norms' and residuals' activations, where
// tensor parallelism alone keeps the whole sequence's on every rank.
TEST(Chapter08, SequenceParallelismHoldsFewerActivations) {
  Outcome tp = run(MPIRUN_NP2, "--tp 2"), sp = run(MPIRUN_NP2, "--tp 2 --sequence-parallel");
  ASSERT_EQ(tp.process.exit_code, 0) << tp.process.out << tp.process.err;
  ASSERT_EQ(sp.process.exit_code, 0) << sp.process.out << sp.process.err;
  const auto a = events(tp.records, "activations"), b = events(sp.records, "activations");
  ASSERT_EQ(a.size(), 1u);
  ASSERT_EQ(b.size(), 1u);
  EXPECT_LT(b[0]["peak_activation_bytes"].get<double>(), a[0]["peak_activation_bytes"].get<double>());
}

TEST(Chapter08, EachStageReportsTheBubblesTheoryAnd1F1BHoldsLess) {
  auto stages = [](const Outcome& r) { return events(r.records, "pipeline_stage"); };
  Outcome one = run(MPIRUN_NP2, "--pp 2 --micro-batches 1"), many = run(MPIRUN_NP2, "--pp 2 --micro-batches 8");
  ASSERT_EQ(one.process.exit_code, 0) << one.process.out << one.process.err;
  ASSERT_EQ(many.process.exit_code, 0) << many.process.out << many.process.err;
  ASSERT_EQ(stages(one).size(), 2u);
  ASSERT_EQ(stages(many).size(), 2u);
  EXPECT_DOUBLE_EQ(stages(one)[0]["theory"].get<double>(), 0.5);
  EXPECT_DOUBLE_EQ(stages(many)[0]["theory"].get<double>(), 1.0 / 9.0);
  // Activations: GPipe holds all 8 micro-batches on the first stage, 1F1B two.
  Outcome gpipe = run(MPIRUN_NP2, "--pp 2 --micro-batches 8 --schedule gpipe");
  ASSERT_EQ(gpipe.process.exit_code, 0) << gpipe.process.out;
  EXPECT_LT(stages(many)[0]["peak_activation_bytes"].get<double>(), stages(gpipe)[0]["peak_activation_bytes"].get<double>());
  // And 1F1B's two do not grow with the step's micro-batches: 2 and 8 of 12 sequences peak alike on the
  // first stage (each activation it sends is let go once sent, not kept to the end of the step).
  // Within one sent activation (12 sequences x 8 tokens x 32 channels in float32): a send may still be
  // on its way at the peak; kept to the end, the six more would be 6 of them.
  const std::string base = " --device cpu --n-layer 4 --n-head 4 --n-embd 32 --steps 6";
  Outcome two_of_12 = run(MPIRUN_NP2, "--pp 2 --global-batch 24 --micro-batches 2", base),
          eight_of_12 = run(MPIRUN_NP2, "--pp 2 --global-batch 96 --micro-batches 8", base);
  ASSERT_EQ(two_of_12.process.exit_code, 0) << two_of_12.process.out << two_of_12.process.err;
  ASSERT_EQ(eight_of_12.process.exit_code, 0) << eight_of_12.process.out << eight_of_12.process.err;
  const double sent_activation = 12 * 8 * 32 * 4;
  EXPECT_LT(stages(eight_of_12)[0]["peak_activation_bytes"].get<double>(),
            stages(two_of_12)[0]["peak_activation_bytes"].get<double>() + sent_activation);
}

// Interleaved 1F1B (--schedule interleaved --virtual-stages v): each rank holds v chunks of the layers
// and a micro-batch passes every rank v times. It passes --verify at 2, 3 and 4 ranks (with DP 2 on top
// and with tensor-parallel stages), a fault in the tied table's exchange from a later step fails there,
// and every loss is the 1F1B run's, bit for bit (the same sums in the same order).
TEST(Chapter08, InterleavedStagesPassVerifyAndMatch1F1B) {
  const std::string six_layers = " --device cpu --n-layer 6 --n-head 3 --n-embd 24 --global-batch 24 --steps 6";
  for (const auto& [mpirun, grid, base] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {MPIRUN_NP2, "--pp 2 --micro-batches 4", kSmall},
           {MPIRUN_NP3, "--pp 3 --micro-batches 3", six_layers},
           {MPIRUN_NP4, "--pp 2 --dp 2 --micro-batches 2", kSmall},
           {MPIRUN_NP4, "--pp 2 --tp 2 --micro-batches 4", kSmall}}) {
    SCOPED_TRACE(grid);
    Outcome plain = run(mpirun, grid + " --schedule 1f1b", base);
    ASSERT_EQ(plain.process.exit_code, 0) << plain.process.out << plain.process.err;
    Outcome interleaved = run(mpirun, grid + " --schedule interleaved --virtual-stages 2 --verify", base);
    ASSERT_EQ(interleaved.process.exit_code, 0) << interleaved.process.out << interleaved.process.err;
    EXPECT_NE(interleaved.process.out.find("interleaved schedule, 2 chunks per rank"), std::string::npos)
        << interleaved.process.out;
    EXPECT_NE(interleaved.process.out.find("against (p-1)/(vm+p-1)"), std::string::npos) << interleaved.process.out;
    EXPECT_NE(interleaved.process.out.find("F0.1"), std::string::npos) << interleaved.process.out;  // the printed schedule
    auto verify = events(interleaved.records, "verify");
    ASSERT_EQ(verify.size(), 1u);
    EXPECT_TRUE(verify[0]["passed"].get<bool>());
    const auto a = events(plain.records, "throughput"), b = events(interleaved.records, "throughput");
    ASSERT_EQ(a.size(), 1u);
    ASSERT_EQ(b.size(), 1u);
    EXPECT_EQ(a[0]["final_loss"].get<float>(), b[0]["final_loss"].get<float>());
    for (const auto& stage : events(interleaved.records, "pipeline_stage")) {
      EXPECT_EQ(stage["virtual_stages"].get<int>(), 2);
      EXPECT_EQ(stage["schedule"].get<std::string>(), "interleaved");
    }
  }
  Outcome faulty = run(MPIRUN_NP2, "--pp 2 --micro-batches 4 --schedule interleaved --virtual-stages 2 --verify "
                                   "--fault skip-tied-exchange --fault-from-step 4");
  EXPECT_EQ(faulty.process.exit_code, 1) << faulty.process.out << faulty.process.err;
  auto verify = events(faulty.records, "verify");
  ASSERT_EQ(verify.size(), 1u) << faulty.process.out;
  EXPECT_EQ(verify[0]["first_failed_step"].get<int>(), 4) << faulty.process.out;
}

// Zero bubble (ZB-H1): backward split into B and W, the W's filling the idle time. At 2, 3 and 4 ranks,
// with TP and under full recomputation (whose blocks' weights are computed in B), --verify passes and the
// losses are 1F1B's bit for bit; the W passes show in the printed schedule; a late fault is caught.
TEST(Chapter08, ZeroBubblePassesVerifyAndMatches1F1B) {
  const std::string three = " --device cpu --n-layer 3 --n-head 3 --n-embd 24 --global-batch 24 --steps 6";
  for (const auto& [mpirun, grid, base] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {MPIRUN_NP2, "--pp 2 --micro-batches 4", kSmall},
           {MPIRUN_NP3, "--pp 3 --micro-batches 6", three},
           {MPIRUN_NP4, "--pp 4 --micro-batches 8", kSmall},
           {MPIRUN_NP4, "--pp 2 --tp 2 --micro-batches 4", kSmall},
           {MPIRUN_NP2, "--pp 2 --micro-batches 4 --recompute full", kSmall}}) {
    SCOPED_TRACE(grid);
    Outcome plain = run(mpirun, grid + " --schedule 1f1b", base);
    ASSERT_EQ(plain.process.exit_code, 0) << plain.process.out << plain.process.err;
    Outcome zero = run(mpirun, grid + " --schedule zero-bubble --verify", base);
    ASSERT_EQ(zero.process.exit_code, 0) << zero.process.out << zero.process.err;
    EXPECT_NE(zero.process.out.find(" W0"), std::string::npos) << zero.process.out;  // the printed schedule
    auto verify = events(zero.records, "verify");
    ASSERT_EQ(verify.size(), 1u);
    EXPECT_TRUE(verify[0]["passed"].get<bool>());
    const auto a = events(plain.records, "step"), b = events(zero.records, "step");
    ASSERT_EQ(a.size(), b.size());
    for (std::size_t k = 0; k < a.size(); ++k) EXPECT_EQ(a[k]["loss"].get<float>(), b[k]["loss"].get<float>()) << k;
  }
  Outcome faulty = run(MPIRUN_NP2, "--pp 2 --micro-batches 4 --schedule zero-bubble --verify --fault lose-micro-batch "
                                   "--fault-from-step 4");
  EXPECT_EQ(faulty.process.exit_code, 1) << faulty.process.out << faulty.process.err;
  auto verify = events(faulty.records, "verify");
  ASSERT_EQ(verify.size(), 1u) << faulty.process.out;
  EXPECT_EQ(verify[0]["first_failed_step"].get<int>(), 4) << faulty.process.out;
}

TEST(Chapter08, TheTimelineAndTheSweepAreWritten) {
  // --trace: the last step of every stage as a Chrome trace (each stage's 2m actions); plot.py draws it.
  const std::string stem = temp_path("ch08_trace"), trace = stem + ".json", png = stem + ".png";
  std::filesystem::remove(png);
  Outcome traced = run(MPIRUN_NP2, "--pp 2 --micro-batches 4 --trace " + trace);
  ASSERT_EQ(traced.process.exit_code, 0) << traced.process.out << traced.process.err;
  std::ifstream in(trace);
  const auto doc = nlohmann::json::parse(in);
  int spans = 0;
  for (const auto& e : doc["traceEvents"]) spans += e["ph"] == "X";
  EXPECT_EQ(spans, 2 * 2 * 4);
  EXPECT_FALSE(std::filesystem::exists(png)) << "the binary drew a chart itself";
  auto drawn = run_process(std::string("python3 ") + PLOT_PY + " timeline " + trace + " " + png);
  ASSERT_EQ(drawn.exit_code, 0) << drawn.out << drawn.err;
  EXPECT_EQ(read_file(png).substr(0, 4), "\x89PNG");
  // --sweep: both schedules at 1-16 micro-batches as metrics, each schedule's timeline beside --trace's
  // stem; plot.py draws the two charts from the metrics.
  const std::string metrics = temp_path("ch08_sweep.jsonl"), prefix = temp_path("ch08_sweep");
  auto swept = run_process(std::string(MPIRUN_NP2) + " " + kBinary + kSmall + " --pp 2 --sweep --metrics " + metrics +
                           " --trace " + prefix + ".json");
  ASSERT_EQ(swept.exit_code, 0) << swept.out << swept.err;
  // schedules x counts x stages: GPipe, 1F1B and zero bubble at 1-16, interleaved (4 layers: 2 chunks of
  // 1 on each of the 2 stages) at the even counts
  const auto sweep = events(read_metrics(metrics), "pipeline_sweep");
  EXPECT_EQ(sweep.size(), 3u * 5u * 2u + 4u * 2u);
  for (const auto& r : sweep)
    if (r["schedule"] == "interleaved") {
      EXPECT_EQ(r["virtual_stages"].get<int>(), 2);
      EXPECT_EQ(r["micro_batches"].get<int>() % 2, 0);
    }
  for (const char* schedule : {"_gpipe.json", "_1f1b.json", "_interleaved.json", "_zero-bubble.json"})
    EXPECT_TRUE(std::filesystem::exists(prefix + schedule)) << prefix + schedule << "\n" << swept.out;
  auto charts = run_process(std::string("python3 ") + PLOT_PY + " pipeline " + metrics + " " + prefix);
  ASSERT_EQ(charts.exit_code, 0) << charts.out << charts.err;
  for (const char* file : {"_bubble.png", "_activations.png"})
    EXPECT_EQ(read_file(prefix + file).substr(0, 4), "\x89PNG") << prefix + file;
}

// --sim-network: every group pays an alpha-beta delay per message; every time shown says it is
// simulated, and the arithmetic is untouched.
TEST(Chapter08, ASimulatedNetworkIsLabelledAndChangesNoResult) {
  Outcome r = run(MPIRUN_NP4, "--tp 2 --pp 2 --sim-network 50,0.125 --verify");
  ASSERT_EQ(r.process.exit_code, 0) << r.process.out << r.process.err;
  for (const char* line : {"Chapter 08: ", "pipeline: ", "throughput: "}) {
    const auto at = r.process.out.find(line);
    ASSERT_NE(at, std::string::npos) << line << "\n" << r.process.out;
    const std::string text = r.process.out.substr(at, r.process.out.find('\n', at) - at);
    EXPECT_NE(text.find("simulated network: alpha 50 us, 0.125 GB/s"), std::string::npos) << text;
  }
  auto throughput = events(r.records, "throughput");
  ASSERT_EQ(throughput.size(), 1u);
  EXPECT_EQ(throughput[0]["simulated_network"], "simulated 50,0.125");
  auto verify = events(r.records, "verify");
  ASSERT_EQ(verify.size(), 1u);
  EXPECT_TRUE(verify[0]["passed"].get<bool>());
}

TEST(Chapter08, VerifyCatchesReplicasThatNeverAverage) {
  // 3D with the DP average left out: each replica follows its own half of the batch.
  Outcome r = run(MPIRUN_NP8, "--tp 2 --pp 2 --dp 2 --verify --fault skip-dp-average");
  EXPECT_EQ(r.process.exit_code, 1) << r.process.out << r.process.err;
  auto verify = events(r.records, "verify");
  ASSERT_EQ(verify.size(), 1u) << r.process.out;
  EXPECT_FALSE(verify[0]["passed"].get<bool>());
  EXPECT_NE(r.process.out.find("FAILED"), std::string::npos);
}

// Every fault of the chapter, on a grid that has what it breaks, from the first step: caught at step 0,
// naming what differed.
TEST(Chapter08, EveryFaultFailsAtItsFirstStep) {
  for (const auto& [mpirun, flags] : std::vector<std::pair<std::string, std::string>>{
           {MPIRUN_NP2, "--dp 2 --fault skip-dp-average"},
           {MPIRUN_NP2, "--tp 2 --fault skip-tp-all-reduce"},
           {MPIRUN_NP2, "--pp 2 --fault lose-micro-batch"},
           {MPIRUN_NP2, "--pp 2 --fault skip-tied-exchange"},
           {MPIRUN_NP2, "--tp 2 --sequence-parallel --fault skip-sp-sum"},
           {MPIRUN_NP2, "--cp 2 --fault skip-cp-offset"},
           {MPIRUN_NP2, "--cp 2 --cp-method ulysses --fault skip-cp-offset"},
           {MPIRUN_NP2, "--cp 2 --fault skip-dp-average"},  // the CP ranks' gradients never averaged
           {MPIRUN_NP2, "--model mlp --tp 2 --fault skip-tp-all-reduce"},
           {MPIRUN_NP4, "--tp 2 --pp 2 --fault lose-micro-batch"},
           // A bug in the layer code, not in a collective: a few hundred noise floors from the reference.
           {MPIRUN_NP2, "--tp 2 --fault exact-gelu"},
           {MPIRUN_NP4, "--tp 2 --dp 2 --fault exact-gelu"},
           {MPIRUN_NP2, "--tp 2 --precision bf16 --fault exact-gelu"},
           // Every TP rank averages the row-parallel biases' gradients: their copies agree, the values do not.
           {MPIRUN_NP2, "--tp 2 --sequence-parallel --fault sp-average-biases"}}) {
    Outcome r = run(mpirun, flags + " --verify");
    EXPECT_EQ(r.process.exit_code, 1) << flags << "\n" << r.process.out << r.process.err;
    auto verify = events(r.records, "verify");
    ASSERT_EQ(verify.size(), 1u) << flags << r.process.out;
    EXPECT_FALSE(verify[0]["passed"].get<bool>()) << flags;
    EXPECT_EQ(verify[0]["first_failed_step"].get<int>(), 0) << flags;
    EXPECT_NE(r.process.out.find("FAILED at step 0: the gradient of"), std::string::npos) << r.process.out;
  }
}

// A sampler bug the run and its 16-bit reference share (--fault skewed-share, at 3 replicas or more: the
// last replica takes the first replica's first sample; both cut their micro-batches with micro_batches):
// the gradients agree micro-batch by micro-batch, and the data order, held against the global batch alone,
// fails at the step it begins, in bf16 and fp16, from the first step and at the last; in float32 too.
TEST(Chapter08, ASamplerBugTheReferenceSharesFailsAtItsStep) {
  for (const auto& [mpirun, flags, from] : std::vector<std::tuple<std::string, std::string, int>>{
           {MPIRUN_NP3, "--dp 3 --precision bf16", 0},
           {MPIRUN_NP4, "--dp 4 --precision fp16", 5},
           {MPIRUN_NP3, "--dp 3", 2}}) {
    Outcome r = run(mpirun, flags + " --verify --fault skewed-share --fault-from-step " + std::to_string(from));
    EXPECT_EQ(r.process.exit_code, 1) << flags << "\n" << r.process.out << r.process.err;
    EXPECT_NE(r.process.out.find("FAILED at step " + std::to_string(from) + ": the data order: sample "),
              std::string::npos) << flags << "\n" << r.process.out;
  }
  Outcome two = run(MPIRUN_NP2, "--dp 2 --verify --fault skewed-share");
  EXPECT_EQ(two.process.exit_code, 2) << two.process.out << two.process.err;
  EXPECT_NE(two.process.err.find("--fault: skewed-share acts at 3 data-parallel ranks or more"), std::string::npos)
      << two.process.err;
}

// A bug in a 16-bit kernel (--fault truncating-gelu, ce-next-row) that the reference by parts repeats, on
// the whole model (pipeline and data parallelism) and in the split layers (tensor, sequence and context
// parallelism): it fails at its step against the same micro-batches computed without a 16-bit kernel,
// from the first step and at the last. With tensor parallelism the loss is split over the vocabulary
// (its own kernels): ce-next-row is refused there.
TEST(Chapter08, ABugInASixteenBitKernelFailsAtItsStep) {
  for (const auto& [mpirun, flags, from] : std::vector<std::tuple<std::string, std::string, int>>{
           {MPIRUN_NP2, "--pp 2 --precision bf16 --fault truncating-gelu", 0},
           {MPIRUN_NP2, "--pp 2 --precision fp16 --fault ce-next-row", 5},
           {MPIRUN_NP3, "--dp 3 --precision bf16 --fault ce-next-row", 2},
           {MPIRUN_NP2, "--tp 2 --sequence-parallel --precision bf16 --fault truncating-gelu", 3},
           {MPIRUN_NP4, "--tp 2 --cp 2 --precision fp16 --fault truncating-gelu", 5}}) {
    Outcome r = run(mpirun, flags + " --verify --fault-from-step " + std::to_string(from),
                    " --device cpu --n-layer 2 --n-head 2 --n-embd 16 --global-batch 48 --steps 6");
    EXPECT_EQ(r.process.exit_code, 1) << flags << "\n" << r.process.out << r.process.err;
    EXPECT_NE(r.process.out.find("FAILED at step " + std::to_string(from) + ": the 16-bit kernels' gradient of"),
              std::string::npos) << flags << "\n" << r.process.out;
  }
  Outcome tp = run(MPIRUN_NP2, "--tp 2 --precision bf16 --verify --fault ce-next-row");
  EXPECT_EQ(tp.process.exit_code, 2);
  EXPECT_NE(tp.process.err.find("splits the loss over the vocabulary"), std::string::npos) << tp.process.err;
}

// Bugs in the split layers' own code (process-wide, so that the 16-bit check's split reference makes them
// too: --fault sp-gather-rows, ring-drop-block, row-parallel-no-sum). In float32 the unsharded model
// catches them at their first step; in 16 bits the check by parts, against the run's own split layers,
// repeats them, and the whole model, which shares none of that code, catches them at the first step.
TEST(Chapter08, ABugInTheSplitLayersIsCaughtByTheWholeModelInEveryPrecision) {
  for (const auto& [mpirun, grid, fault] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {MPIRUN_NP2, "--tp 2 --sequence-parallel", "sp-gather-rows"},
           {MPIRUN_NP2, "--cp 2", "ring-drop-block"},
           {MPIRUN_NP2, "--tp 2", "row-parallel-no-sum"},
           {MPIRUN_NP2, "--tp 2 --sequence-parallel", "row-parallel-no-sum"},
           {MPIRUN_NP4, "--tp 4 --sequence-parallel", "sp-gather-rows"},
           {MPIRUN_NP3, "--cp 3", "ring-drop-block"}})
    for (const std::string precision : {"fp32", "bf16"}) {
      const std::string flags = grid + " --precision " + precision + " --fault " + fault + " --verify --steps 2";
      Outcome r = run(mpirun, flags, kModel);
      EXPECT_EQ(r.process.exit_code, 1) << flags << "\n" << r.process.out << r.process.err;
      auto verify = events(r.records, "verify");
      ASSERT_EQ(verify.size(), 1u) << flags << r.process.out;
      EXPECT_EQ(verify[0]["first_failed_step"].get<int>(), 0) << flags;
      const std::string caught = precision == "fp32" ? "FAILED at step 0: the gradient of 'transformer"
                                                     : "from the whole model's in float32";
      EXPECT_NE(r.process.out.find(caught), std::string::npos) << flags << "\n" << r.process.out;
    }
  // In fp16 with its loss scale, and on a 4-rank grid of TP and CP.
  for (const auto& [mpirun, flags] : std::vector<std::pair<std::string, std::string>>{
           {MPIRUN_NP2, "--tp 2 --precision fp16 --fault row-parallel-no-sum"},
           {MPIRUN_NP4, "--tp 2 --cp 2 --precision bf16 --fault ring-drop-block"}}) {
    Outcome r = run(mpirun, flags + " --verify --steps 2", kModel);
    EXPECT_EQ(r.process.exit_code, 1) << flags << "\n" << r.process.out << r.process.err;
    EXPECT_NE(r.process.out.find("FAILED at step 0: the gradient of 'transformer"), std::string::npos) << flags << r.process.out;
    EXPECT_NE(r.process.out.find("from the whole model's in float32"), std::string::npos) << flags << r.process.out;
  }
}

// Faults that begin late in 1000-step runs, at 2 and 3 ranks, the GPT and the MLP: caught at that step
// and at no step before. Without the fault the ring's run passes all 1000.
TEST(Chapter08, ALateFaultIsCaughtAtItsStepInLongRuns) {
  const std::string small = " --device cpu --n-layer 3 --n-head 3 --n-embd 24 --global-batch 24 --steps 1000 "
                            "--log-every 1000 --verify";
  for (const auto& [mpirun, flags, from] : std::vector<std::tuple<std::string, std::string, int>>{
           {MPIRUN_NP3, "--dp 3 --fault skip-dp-average", 700},
           {MPIRUN_NP3, "--pp 3 --fault skip-tied-exchange", 500},
           {MPIRUN_NP3, "--tp 3 --fault skip-tp-all-reduce", 999},
           {MPIRUN_NP3, "--cp 3 --fault skip-cp-offset", 700},
           {MPIRUN_NP3, "--pp 3 --schedule zero-bubble --micro-batches 3 --fault skip-tied-exchange", 700},
           {MPIRUN_NP2, "--model mlp --hidden 64 --layers 3 --tp 2 --fault lose-micro-batch", 700},
           {MPIRUN_NP3, "--tp 3 --fault exact-gelu", 700},
           {MPIRUN_NP3, "--dp 3 --fault skewed-share", 700}}) {
    const std::string metrics = temp_path("ch08_late.jsonl");
    auto faulty = run_process(mpirun + " " + kBinary + small + " " + flags + " --fault-from-step " +
                              std::to_string(from) + " --metrics " + metrics);
    EXPECT_EQ(faulty.exit_code, 1) << flags << "\n" << faulty.out << faulty.err;
    auto verify = events(read_metrics(metrics), "verify");
    ASSERT_EQ(verify.size(), 1u) << faulty.out;
    EXPECT_EQ(verify[0]["first_failed_step"].get<int>(), from) << flags << "\n" << faulty.out;
    std::remove(metrics.c_str());
  }
  // The bugs of the split layers (which the 16-bit split reference repeats) on a smaller GPT: in float32
  // from step 700 of 1000, against the unsharded model; in bf16 from step 210 of 300 (the split reference
  // and the whole model each cost a forward and backward), caught by the whole model.
  const std::string smaller = " --device cpu --n-layer 2 --n-head 2 --n-embd 16 --global-batch 24 --log-every 1000 --verify";
  for (const auto& [mpirun, flags, from] : std::vector<std::tuple<std::string, std::string, int>>{
           {MPIRUN_NP2, "--tp 2 --sequence-parallel --fault sp-gather-rows --steps 1000", 700},
           {MPIRUN_NP2, "--tp 2 --fault row-parallel-no-sum --steps 1000", 700},
           {MPIRUN_NP2, "--cp 2 --fault ring-drop-block --precision bf16 --steps 300", 210},
           {MPIRUN_NP2, "--tp 2 --sequence-parallel --fault sp-gather-rows --precision bf16 --steps 300", 210},
           {MPIRUN_NP2, "--tp 2 --fault row-parallel-no-sum --precision bf16 --steps 300", 210},
           {MPIRUN_NP3, "--cp 3 --fault ring-drop-block --precision bf16 --steps 300", 210}}) {
    auto faulty = run_process(mpirun + " " + kBinary + smaller + " " + flags + " --fault-from-step " + std::to_string(from));
    EXPECT_EQ(faulty.exit_code, 1) << flags << "\n" << faulty.out << faulty.err;
    EXPECT_NE(faulty.out.find("FAILED at step " + std::to_string(from) + ": the gradient of 'transformer"), std::string::npos)
        << flags << faulty.out;
    if (flags.find("bf16") != std::string::npos) {
      EXPECT_NE(faulty.out.find("from the whole model's in float32"), std::string::npos) << flags << faulty.out;
    }
  }
  // A 16-bit kernel's bug in the split layers, from step 210 of 300 at 3 TP ranks (their sums in the
  // ring's order, each partial rounded to 16 bits): against the same parts without a 16-bit kernel.
  auto kernel = run_process(std::string(MPIRUN_NP3) + " " + kBinary +
                            " --device cpu --n-layer 2 --n-head 3 --n-embd 24 --global-batch 24 --log-every 1000 --verify"
                            " --tp 3 --precision bf16 --steps 300 --fault truncating-gelu --fault-from-step 210");
  EXPECT_EQ(kernel.exit_code, 1) << kernel.out << kernel.err;
  EXPECT_NE(kernel.out.find("FAILED at step 210: the 16-bit kernels' gradient of"), std::string::npos) << kernel.out;
  // The sampler's bug in bf16, which the reference by parts shares, from step 210 of 300: the data order.
  auto sampler = run_process(std::string(MPIRUN_NP3) + " " + kBinary + smaller +
                             " --dp 3 --precision bf16 --steps 300 --fault skewed-share --fault-from-step 210");
  EXPECT_EQ(sampler.exit_code, 1) << sampler.out << sampler.err;
  EXPECT_NE(sampler.out.find("FAILED at step 210: the data order: sample "), std::string::npos) << sampler.out;
  // TP's fault begins at step 999, so its run passes 999 steps first; the ring's runs whole.
  auto healthy = run_process(std::string(MPIRUN_NP3) + " " + kBinary + small + " --cp 3");
  EXPECT_EQ(healthy.exit_code, 0) << healthy.out << healthy.err;
}

// 120 steps of 48 cross the 4000 problems' epoch boundary at 3 replicas: every step still takes a whole
// global batch, and the run stays within the unsharded run's noise floor.
TEST(Chapter08, ALongRunAtThreeReplicasCrossesTheEpoch) {
  auto r = run_process(std::string(MPIRUN_NP3) + " " + kBinary +
                       " --device cpu --dp 3 --n-layer 2 --n-head 2 --n-embd 16 --steps 120 --log-every 1000 --verify");
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("PASSED"), std::string::npos) << r.out;
}

// The defaults run at any world size: at 7 ranks (DP 7 of 4 micro-batches) the default global batch of
// 48 is rounded up to 56, and the log says so; a given one that does not divide is refused (below).
TEST(Chapter08, TheDefaultsRunAtSevenRanks) {
  auto r = run_process(std::string(MPIRUN_NP7) + " " + kBinary + " --device cpu --n-layer 1 --n-embd 16 --n-head 2 --steps 2 --verify");
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("global batch 56: the default 48 rounded up to a multiple of DP x --micro-batches (7 x 4)"),
            std::string::npos) << r.out;
}

// Mixed precision (--precision bf16|fp16): the forward under autocast over float32 masters, the
// row-parallel sums all-reduced in 16 bits, fp16's loss scale agreed over the whole grid. Every grid
// learns (the final loss a fifth below the first); too large a loss scale skips the same steps on every
// rank, then training goes on. (--verify checks 16 bits by their parts: the next tests.)
TEST(Chapter08, MixedPrecisionTrainsOnEveryGrid) {
  for (const std::string precision : {"bf16", "fp16"})
    for (const auto& [mpirun, grid] : std::vector<std::pair<std::string, std::string>>{
             {MPIRUN_NP2, "--tp 2"},
             {MPIRUN_NP2, "--tp 2 --sequence-parallel"},
             {MPIRUN_NP2, "--pp 2"},
             {MPIRUN_NP4, "--tp 2 --pp 2 --dp 1"},
             {MPIRUN_NP3, "--dp 3"},
             {MPIRUN_NP4, "--dp 2 --pp 2 --reduce-dtype bf16"},  // DDP's average in 16 bits too
             {MPIRUN_NP2, "--model mlp --hidden 64 --layers 3 --tp 2"}}) {
      Outcome r = run(mpirun, grid + " --precision " + precision + " --steps 20 --log-every 1", kModel);
      ASSERT_EQ(r.process.exit_code, 0) << precision << " " << grid << "\n" << r.process.out << r.process.err;
      auto steps = events(r.records, "step"), throughput = events(r.records, "throughput");
      ASSERT_EQ(steps.size(), 20u) << grid;
      ASSERT_EQ(throughput.size(), 1u) << grid;
      EXPECT_EQ(throughput[0]["precision"].get<std::string>(), precision);
      EXPECT_EQ(throughput[0]["reduce_dtype"].get<std::string>(), grid.find("bf16") == std::string::npos ? "fp32" : "bf16");
      EXPECT_LT(steps.back()["loss"].get<double>(), 0.8 * steps.front()["loss"].get<double>())
          << precision << " " << grid << "\n" << r.process.out;
    }
  Outcome overflowing = run(MPIRUN_NP4, "--tp 2 --pp 2 --precision fp16 --loss-scale 1099511627776 --steps 40", kModel);
  ASSERT_EQ(overflowing.process.exit_code, 0) << overflowing.process.out << overflowing.process.err;
  auto throughput = events(overflowing.records, "throughput");
  ASSERT_EQ(throughput.size(), 1u);
  const int skipped = throughput[0]["skipped_steps"].get<int>();
  EXPECT_GE(skipped, 20) << overflowing.process.out;  // 2^40 halves below fp16's range in about 25 steps
  EXPECT_LT(skipped, 40) << overflowing.process.out;
  EXPECT_NE(overflowing.process.out.find("fp16: " + std::to_string(skipped) + " of 40 steps skipped"), std::string::npos)
      << overflowing.process.out;
}

// --recompute on the split GPT: tensor-parallel blocks run again with their collectives, pipeline stages
// recompute each micro-batch's blocks in its backward; every grid passes --verify, and full
// recomputation holds fewer activations at their peak than none on every stage.
TEST(Chapter08, RecomputationPassesVerifyOnEveryGridInLessMemory) {
  for (const auto& [mpirun, grid] : std::vector<std::pair<std::string, std::string>>{
           {MPIRUN_NP2, "--tp 2 --sequence-parallel"}, {MPIRUN_NP2, "--pp 2"}, {MPIRUN_NP4, "--tp 2 --pp 2"}}) {
    std::map<std::string, std::vector<double>> peaks;
    for (const std::string recompute : {"none", "full"}) {  // selective: chapter 04's and gpt_test's
      Outcome r = run(mpirun, grid + " --verify --recompute " + recompute);
      ASSERT_EQ(r.process.exit_code, 0) << grid << " " << recompute << "\n" << r.process.out << r.process.err;
      auto verify = events(r.records, "verify");
      ASSERT_EQ(verify.size(), 1u) << grid;
      EXPECT_TRUE(verify[0]["passed"].get<bool>()) << grid << " " << recompute;
      auto throughput = events(r.records, "throughput");
      ASSERT_EQ(throughput.size(), 1u) << grid;
      peaks[recompute] = throughput[0]["peak_activation_bytes"].get<std::vector<double>>();
    }
    for (std::size_t stage = 0; stage < peaks["none"].size(); ++stage)
      EXPECT_LT(peaks["full"][stage], peaks["none"][stage]) << grid << " stage " << stage;
  }
}

// 16 bits are checked by their parts: each micro-batch through the stages is the reference's on it, bit
// for bit, and the sums over micro-batches (float32) and replicas (the reduce type) keep their bound.
// Without TP or CP the reference is the unsharded GPT; with TP or CP (and for the MLP) the run's own
// split model, its TP x CP ranks on threads of each process, at 4 TP ranks too (the TP group adds its
// float32 sums in the ring's order, as the reference does). A lost micro-batch, a tied table not
// exchanged, replicas that never average, a TP all-reduce or a sequence-parallel sum left out, a ring
// that forgets its shard's offset: each fails at the step it begins.
TEST(Chapter08, MixedPrecisionIsVerifiedByItsParts) {
  for (const auto& [mpirun, flags, split] : std::vector<std::tuple<std::string, std::string, bool>>{
           {MPIRUN_NP2, "--pp 2 --precision bf16", false},
           {MPIRUN_NP4, "--pp 2 --dp 2 --precision fp16 --reduce-dtype fp16", false},
           {MPIRUN_NP2, "--dp 2 --reduce-dtype bf16", false},
           {MPIRUN_NP2, "--tp 2 --precision bf16", true},
           {MPIRUN_NP2, "--tp 2 --sequence-parallel --precision fp16", true},
           {MPIRUN_NP4, "--tp 4 --sequence-parallel --precision bf16", true},  // float32 sums in the ring's order
           {MPIRUN_NP8, "--tp 2 --pp 2 --dp 2 --precision bf16 --reduce-dtype bf16", true},  // the 3D grid
           {MPIRUN_NP2, "--model mlp --tp 2 --precision bf16", true},
           {MPIRUN_NP3, "--model mlp --dp 3 --precision fp16", true},
           {MPIRUN_NP3, "--cp 3 --precision bf16", true},  // ring attention
           {MPIRUN_NP4, "--tp 2 --cp 2 --cp-method ulysses --precision fp16", true}}) {
    Outcome r = run(mpirun, flags + " --verify");
    ASSERT_EQ(r.process.exit_code, 0) << flags << "\n" << r.process.out << r.process.err;
    auto verify = events(r.records, "verify");
    ASSERT_EQ(verify.size(), 1u) << flags;
    EXPECT_TRUE(verify[0]["passed"].get<bool>()) << flags;
    EXPECT_TRUE(verify[0]["by_parts"].get<bool>()) << flags;
    EXPECT_EQ(verify[0]["split_reference"].get<bool>(), split) << flags;
    EXPECT_LE(verify[0]["gradient_ratio"].get<double>(), 1.0) << flags;
    EXPECT_NE(r.process.out.find("micro-batch by micro-batch"), std::string::npos) << r.process.out;
    EXPECT_EQ(r.process.out.find("split as the run splits it") != std::string::npos, split) << r.process.out;
    // Beside the split layers, the whole model that shares none of their code (0: it did not run).
    EXPECT_EQ(verify[0]["whole_ratio"].get<double>() > 0, split) << flags;
    EXPECT_LE(verify[0]["whole_ratio"].get<double>(), 1.0) << flags;
    EXPECT_LE(verify[0]["whole_loss_ratio"].get<double>(), 1.0) << flags;
  }
  for (const auto& [mpirun, flags] : std::vector<std::pair<std::string, std::string>>{
           {MPIRUN_NP2, "--pp 2 --precision bf16 --fault lose-micro-batch"},
           {MPIRUN_NP2, "--pp 2 --precision fp16 --fault skip-tied-exchange"},
           {MPIRUN_NP2, "--dp 2 --precision bf16 --reduce-dtype bf16 --fault skip-dp-average"},
           {MPIRUN_NP2, "--tp 2 --precision bf16 --fault skip-tp-all-reduce"},
           {MPIRUN_NP2, "--tp 2 --sequence-parallel --precision bf16 --fault skip-sp-sum"},
           {MPIRUN_NP4, "--tp 4 --sequence-parallel --precision bf16 --fault skip-sp-sum"},
           {MPIRUN_NP2, "--model mlp --tp 2 --precision fp16 --fault skip-tp-all-reduce"},
           {MPIRUN_NP2, "--cp 2 --precision bf16 --fault skip-cp-offset"}}) {
    Outcome r = run(mpirun, flags + " --verify --fault-from-step 3");
    EXPECT_EQ(r.process.exit_code, 1) << flags << "\n" << r.process.out << r.process.err;
    EXPECT_NE(r.process.out.find("FAILED at step 3: the gradient of"), std::string::npos) << flags << r.process.out;
  }
}

TEST(Chapter08, BadInputIsOneLineAndExitCodeTwo) {
  for (const auto& [mpirun, flags, named] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {MPIRUN_NP2, "--tp 3", "--tp"},                                 // 3 does not divide 2 ranks
           {MPIRUN_NP4, "--tp 2 --pp 2 --dp 2", "--tp"},                    // needs 8 ranks
           {MPIRUN_NP2, "--tp 2 --n-head 3 --n-embd 33", "--n-head"},       // 3 heads on 2 ranks
           {MPIRUN_NP2, "--pp 2 --n-layer 3", "--n-layer"},                 // 3 layers on 2 stages
           {MPIRUN_NP2, "--pp 2 --micro-batches 0", "--micro-batches"},
           {MPIRUN_NP2, "--pp 2 --schedule zigzag", "--schedule"},
           {MPIRUN_NP2, "--pp 2 --micro-batches 5", "--global-batch"},   // 48 is not 5 micro-batches
           {MPIRUN_NP2, "--sweep", "--sweep"},                            // no pipeline to sweep
           {MPIRUN_NP2, "--tp 2 --fault skip-dp-average", "--fault"},    // no replicas to average
           {MPIRUN_NP2, "--dp 2 --fault skip-tp-all-reduce", "--fault"},  // no TP group
           {MPIRUN_NP2, "--pp 2 --micro-batches 1 --fault lose-micro-batch", "--fault"},  // nothing left to run
           {MPIRUN_NP2, "--tp 2 --fault skip-tied-exchange", "--fault"},  // one stage holds the table
           {MPIRUN_NP2, "--tp 2 --fault skip-sp-sum", "--fault"},         // no sequence parallelism
           {MPIRUN_NP2, "--tp 2 --fault sp-unsummed-bias", "--fault"},
           {MPIRUN_NP2, "--tp 2 --fault sp-average-biases", "--fault"},
           {MPIRUN_NP2, "--model mlp --tp 2 --fault exact-gelu", "--fault"},  // the MLP has no GELU blocks
           {MPIRUN_NP2, "--tp 2 --fault sp-gather-rows", "--fault"},          // no sequence parallelism
           {MPIRUN_NP2, "--cp 2 --cp-method ulysses --fault ring-drop-block", "--cp-method"},  // no ring
           {MPIRUN_NP2, "--tp 2 --fault ring-drop-block", "--fault"},         // no context parallelism
           {MPIRUN_NP2, "--dp 2 --fault row-parallel-no-sum", "--fault"},     // no TP group
           {MPIRUN_NP2, "--dp 2 --fault skip-dp-average --fault-from-step 6", "--fault-from-step"},  // never reached
           {MPIRUN_NP4, "--pp 2 --sweep", "--global-batch"},             // 48 is not DP 2 x 16 micro-batches
           {MPIRUN_NP2, "--sequence-parallel", "--sequence-parallel"},    // no TP group to split the sequence in
           {MPIRUN_NP2, "--tp 2 --sequence-parallel --digits 3", "--sequence-parallel"},  // 11 tokens
           {MPIRUN_NP2, "--model mlp --pp 2", "--pp"},                    // the MLP has no stages
           {MPIRUN_NP2, "--model mlp --tp 2 --sequence-parallel", "--sequence-parallel"},
           {MPIRUN_NP2, "--model mlp --tp 2 --hidden 255", "--hidden"},
           {MPIRUN_NP2, "--pp 2 --sim-network 10,fast", "--sim-network"},
           {MPIRUN_NP2, "--pp 2 --schedule interleaved", "--schedule"},          // how many chunks?
           {MPIRUN_NP2, "--pp 2 --virtual-stages 2", "--virtual-stages"},       // 1F1B runs one chunk
           {MPIRUN_NP2, "--pp 2 --schedule interleaved --virtual-stages 4", "--virtual-stages"},  // 4 layers, 8 chunks
           {MPIRUN_NP2, "--tp 2 --schedule interleaved --virtual-stages 2", "--schedule"},  // no pipeline: --pp is 1
           {MPIRUN_NP2, "--pp 2 --schedule interleaved --virtual-stages 2 --micro-batches 3", "--micro-batches"},
           {MPIRUN_NP2, "--pp 2 --schedule interleaved --virtual-stages 2 --fault lose-micro-batch", "--fault"},
           {MPIRUN_NP4, "--pp 2 --dp 2 --schedule zero-bubble", "--schedule"},  // DDP waits for the weights
           {MPIRUN_NP2, "--cp 3", "--cp"},                                 // 2 ranks do not divide into CP 3
           {MPIRUN_NP2, "--cp 2 --cp-method tree", "--cp-method"},
           {MPIRUN_NP2, "--cp 2 --model mlp", "--cp"},                    // the MLP has no sequence
           {MPIRUN_NP4, "--tp 2 --cp 2 --sequence-parallel", "--cp"},     // both split the sequence
           {MPIRUN_NP3, "--cp 3 --cp-method ulysses", "--cp"},            // 4 heads on 3 ranks
           {MPIRUN_NP2, "--dp 2 --fault skip-cp-offset", "--fault"},       // no CP group
           {MPIRUN_NP2, "--cp 2 --mem-limit-mb 0", "--mem-limit-mb"},
           {MPIRUN_NP2, "--cp 2 --mem-limit-mb 1e-7", "--mem-limit-mb"},   // under a byte
           {MPIRUN_NP2, "--cp 2 --mem-limit-mb 1e40", "--mem-limit-mb"}}) {  // past 2^63 bytes
    Outcome r = run(mpirun, flags);
    EXPECT_EQ(r.process.exit_code, 2) << flags << "\n" << r.process.out << r.process.err;
    EXPECT_NE(r.process.err.find(named), std::string::npos) << flags << ": " << r.process.err;
  }
  // Refused before any work is shown: the schedule of a pipeline the layers cannot fill is not printed.
  Outcome layers = run(MPIRUN_NP2, "--pp 2 --n-layer 3");
  EXPECT_EQ(layers.process.out.find("stage 0:"), std::string::npos) << layers.process.out;
}

// Every replica is inspected, not only the copy the whole model is gathered from: the last data- or
// context-parallel replica's update going astray by one rounding fails at its step, the last step's at the
// end of the run.
void expect_stray_replica_caught(const std::string& mpirun, const std::string& flags, int steps, int from,
                                 const std::string& fault = "stray-replica", const std::string& model = kModel) {
  Outcome r = run(mpirun, flags + " --verify --log-every 1000 --steps " + std::to_string(steps) + " --fault " + fault +
                              " --fault-from-step " + std::to_string(from), model);
  EXPECT_EQ(r.process.exit_code, 1) << flags << "\n" << r.process.out << r.process.err;
  EXPECT_NE(r.process.out.find("FAILED at step " + std::to_string(from) + ": after the update of step " +
                               std::to_string(from) + ", rank "),
            std::string::npos)
      << flags << "\n" << r.process.out;
  // The parameters stray, or the optimizer state alone (caught before it has moved a parameter).
  EXPECT_NE(r.process.out.find(fault == "stray-moment" ? "holds other optimizer state than its replicas"
                                                       : "holds other parameters than its replicas"),
            std::string::npos) << r.process.out;
}

TEST(Chapter08, VerifyCatchesAStrayReplicaAtItsStep) {
  expect_stray_replica_caught(MPIRUN_NP2, "--dp 2", 6, 3);
  expect_stray_replica_caught(MPIRUN_NP2, "--cp 2 --precision bf16", 6, 5);
  expect_stray_replica_caught(MPIRUN_NP4, "--pp 2 --dp 2", 6, 5);
  auto alone = run(MPIRUN_NP2, "--pp 2 --verify --fault stray-replica");
  EXPECT_EQ(alone.process.exit_code, 2);
  EXPECT_NE(alone.process.err.find("stray-replica needs data or context parallelism"), std::string::npos) << alone.process.err;
}

// The copies every TP rank holds whole (layer norms, row-parallel biases) are inspected too: the whole
// model takes TP rank 0's, and the last TP rank's going astray by one rounding fails at its step, the
// last step's at the end, at 2 and 3 TP ranks, on a pipeline's later stage, in float32 and bfloat16.
const std::string kThreeHeads = " --device cpu --n-layer 2 --n-head 3 --n-embd 24 --global-batch 48";
TEST(Chapter08, VerifyCatchesAStrayTpCopyAtItsStep) {
  expect_stray_replica_caught(MPIRUN_NP2, "--tp 2", 6, 3, "stray-tp-copy");
  expect_stray_replica_caught(MPIRUN_NP2, "--tp 2 --sequence-parallel --precision bf16", 6, 5, "stray-tp-copy");
  expect_stray_replica_caught(MPIRUN_NP3, "--tp 3", 6, 2, "stray-tp-copy", kThreeHeads);
  expect_stray_replica_caught(MPIRUN_NP4, "--tp 2 --pp 2", 6, 4, "stray-tp-copy");
  // A bug that does so: the last TP rank leaves its row-parallel biases' partial gradients (32 values each,
  // whose floor the whole model pools) out of the sequence-parallel sum.
  expect_stray_replica_caught(MPIRUN_NP2, "--tp 2 --sequence-parallel", 6, 0, "sp-unsummed-bias");
  expect_stray_replica_caught(MPIRUN_NP2, "--tp 2 --sequence-parallel --precision bf16", 6, 5, "sp-unsummed-bias");
  auto alone = run(MPIRUN_NP2, "--dp 2 --verify --fault stray-tp-copy");
  EXPECT_EQ(alone.process.exit_code, 2);
  EXPECT_NE(alone.process.err.find("stray-tp-copy needs tensor parallelism"), std::string::npos) << alone.process.err;
}

// The optimizer state of every copy is compared too: the last TP rank's AdamW moment of a tensor they all
// hold whole (or, without TP, the last replica's) moved by one rounding fails at the update that moved
// it, before it has moved a parameter, at 2 and 3 TP ranks, with DP, in fp32 and bf16.
TEST(Chapter08, VerifyCatchesAStrayMomentAtItsStep) {
  expect_stray_replica_caught(MPIRUN_NP2, "--tp 2", 6, 0, "stray-moment");
  expect_stray_replica_caught(MPIRUN_NP3, "--tp 3 --precision bf16", 6, 5, "stray-moment", kThreeHeads);
  expect_stray_replica_caught(MPIRUN_NP3, "--dp 3 --precision bf16", 6, 2, "stray-moment");
  auto alone = run(MPIRUN_NP2, "--pp 2 --verify --fault stray-moment");
  EXPECT_EQ(alone.process.exit_code, 2);
  EXPECT_NE(alone.process.err.find("stray-moment needs a rank holding what another holds"), std::string::npos)
      << alone.process.err;
}

// A split-layer bug every TP rank shares leaves their copies alike (--fault sp-average-biases: the
// row-parallel biases' partial gradients averaged, not added, half their gradient at TP 2). A 16-bit run's
// split layers run again in float32 against the whole model (Lockstep::check_whole), so it fails at its
// step in bf16 and fp16 too, where the 16-bit floor alone let it pass at ill-conditioned steps.
void expect_shared_split_bug_caught(const std::string& mpirun, const std::string& flags, int steps, int from) {
  Outcome r = run(mpirun, flags + " --verify --log-every 1000 --steps " + std::to_string(steps) +
                              " --fault sp-average-biases --fault-from-step " + std::to_string(from), kModel);
  EXPECT_EQ(r.process.exit_code, 1) << flags << "\n" << r.process.out << r.process.err;
  EXPECT_NE(r.process.out.find("FAILED at step " + std::to_string(from) + ": "), std::string::npos)
      << flags << "\n" << r.process.out;
  EXPECT_NE(r.process.out.find("the gradient of 'transformer.h."), std::string::npos) << r.process.out;
  EXPECT_NE(r.process.out.find(".c_proj.bias'"), std::string::npos) << r.process.out;
}

TEST(Chapter08, ASplitLayerBugEveryTpRankSharesFailsAtItsStepIn16Bits) {
  expect_shared_split_bug_caught(MPIRUN_NP2, "--tp 2 --sequence-parallel --precision bf16", 6, 5);
  expect_shared_split_bug_caught(MPIRUN_NP4, "--tp 4 --sequence-parallel --precision fp16", 6, 3);
}

TEST(Chapter08, VerifyCatchesAStrayTpCopyLateInLongRuns) {
  expect_stray_replica_caught(MPIRUN_NP2, "--tp 2", 1000, 700, "stray-tp-copy");
  expect_stray_replica_caught(MPIRUN_NP2, "--tp 2", 1000, 700, "stray-moment");
  expect_stray_replica_caught(MPIRUN_NP3, "--tp 3 --precision bf16", 1000, 999, "stray-tp-copy", kThreeHeads);
  expect_stray_replica_caught(MPIRUN_NP2, "--tp 2 --sequence-parallel", 1000, 700, "sp-unsummed-bias");
  expect_stray_replica_caught(MPIRUN_NP4, "--tp 4 --sequence-parallel --precision bf16", 300, 210, "sp-unsummed-bias");
  expect_stray_replica_caught(MPIRUN_NP2, "--tp 2 --sequence-parallel --precision bf16", 300, 299, "sp-unsummed-bias");
  // The same biases averaged on every rank, where the copies agree: caught at its step late in 16 bits,
  // the last step included, and in float32.
  expect_shared_split_bug_caught(MPIRUN_NP4, "--tp 4 --sequence-parallel --precision bf16", 300, 210);
  expect_shared_split_bug_caught(MPIRUN_NP2, "--tp 2 --sequence-parallel --precision bf16", 300, 299);
  Outcome averaged = run(MPIRUN_NP2, "--tp 2 --sequence-parallel --verify --log-every 1000 --steps 1000 --fault "
                                     "sp-average-biases --fault-from-step 700", kModel);
  EXPECT_EQ(averaged.process.exit_code, 1) << averaged.process.out << averaged.process.err;
  EXPECT_NE(averaged.process.out.find("FAILED at step 700: the gradient of 'transformer.h."), std::string::npos)
      << averaged.process.out;
  EXPECT_NE(averaged.process.out.find(".c_proj.bias'"), std::string::npos) << averaged.process.out;
}

TEST(Chapter08, VerifyCatchesAStrayReplicaLateInLongRuns) {
  expect_stray_replica_caught(MPIRUN_NP2, "--dp 2", 1000, 700);
  expect_stray_replica_caught(MPIRUN_NP4, "--tp 2 --dp 2 --precision bf16", 300, 299);
}

// On a GPU, in lock-step with the unsharded GPT: one rank on NCCL; PP with 1F1B and interleaved; TP with
// sequence parallelism in bf16; CP by the ring and by Ulysses beside TP; the 3D grid at 8 ranks sharing
// the GPU; a lost micro-batch begun late caught at its step.
TEST(Chapter08, RunsOnTheGpuEveryParallelismInLockStep) {
  const std::string model = " --n-layer 4 --n-head 4 --n-embd 32 --global-batch 48 --verify";
  expect_gpu_runs(kBinary, {{MPIRUN_NP1, one_rank_on_nccl() + model + " --steps 6"},
                            {MPIRUN_NP2, "--backend mpi --pp 2 --schedule 1f1b" + model + " --steps 6"},
                            {MPIRUN_NP2, "--backend mpi --pp 2 --schedule interleaved --virtual-stages 2 --micro-batches 4" +
                                             model + " --steps 6"},
                            {MPIRUN_NP2, "--backend mpi --tp 2 --sequence-parallel --precision bf16" + model + " --steps 6"},
                            {MPIRUN_NP2, "--backend mpi --cp 2" + model + " --steps 6"},
                            {MPIRUN_NP4, "--backend mpi --tp 2 --cp 2 --cp-method ulysses --precision bf16" + model + " --steps 6"},
                            {MPIRUN_NP8, "--backend mpi --tp 2 --pp 2 --dp 2" + model + " --steps 6"},
                            {MPIRUN_NP2, "--backend mpi --pp 2 --micro-batches 4" + model +
                                             " --steps 30 --fault lose-micro-batch --fault-from-step 20",
                             20}});
}

}  // namespace
}  // namespace course::testing
