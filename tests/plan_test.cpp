// The planner's command (benchmarks/plan.cpp) as a participant runs it: GPT-3 175B on 1,024 A100s ranked,
// the rejected configurations counted by reason, Megatron-LM 2021's table beside the predictions, and bad
// input refused in one line.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <set>

#include <nlohmann/json.hpp>

#include "common/planner/calibration.h"
#include "support/process.h"

namespace course::testing {
namespace {

const std::string kPlan = PLAN_BINARY;

// With only Megatron-LM 2021's techniques the top configurations are the paper's family: TP inside a
// node, PP across nodes, DP over the rest, and the paper's own TP 8 x PP 8 among the first five, within
// 5% of the first (at this batch the model puts TP 4 x PP 16 with six chunks a stage 2% ahead: TP 8's
// all-reduces cost a tenth of the step, TP 4's half that, and 96 micro-batches a replica keep PP 16's
// bubble small). Every kind of rejection the decision needs is reported.
TEST(Plan, Gpt3OnA1024A100sRanksThePapersFamilyFirst) {
  const std::string metrics = temp_path("plan.jsonl");
  const auto r = run_process(kPlan + " --paper-techniques --top 5 --metrics " + metrics);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto records = read_metrics(metrics);
  const auto plans = events(records, "plan");
  ASSERT_EQ(plans.size(), 5u) << r.out;
  for (const auto& plan : plans) {
    EXPECT_LE(plan["tp"].get<int>(), 8) << r.out;
    EXPECT_GE(plan["tp"].get<int>(), 4) << r.out;
    EXPECT_GT(plan["tp"].get<int>() * plan["pp"].get<int>(), 8) << "PP across nodes\n" << r.out;
    EXPECT_GT(plan["dp"].get<int>(), 1) << r.out;
  }
  bool papers = false;
  for (const auto& plan : plans)
    if (plan["tp"] == 8 && plan["pp"] == 8) {
      papers = true;
      EXPECT_GT(plan["tokens_per_second"].get<double>(), 0.95 * plans[0]["tokens_per_second"].get<double>()) << r.out;
    }
  EXPECT_TRUE(papers) << "TP(8)-PP(8)-DP(16) among the first five\n" << r.out;
  for (std::size_t i = 1; i < plans.size(); ++i)
    EXPECT_LE(plans[i]["tokens_per_second"].get<double>(), plans[i - 1]["tokens_per_second"].get<double>());
  std::set<std::string> reasons;
  for (const auto& rejected : events(records, "plan_rejected")) reasons.insert(rejected["reason"].get<std::string>());
  for (const char* reason : {"TP across nodes", "out of memory", "too few micro-batches for the bubble"})
    EXPECT_TRUE(reasons.count(reason)) << reason << "\n" << r.out;
  std::filesystem::remove(metrics);
}

// With every technique of the course, the top configuration still keeps its model parallelism (TP, and
// CP when it helps) inside one node and spans the nodes with PP and DP.
TEST(Plan, EveryTechniqueKeepsModelParallelismInsideANode) {
  const std::string metrics = temp_path("plan.jsonl");
  const auto r = run_process(kPlan + " --top 3 --metrics " + metrics);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto plans = events(read_metrics(metrics), "plan");
  ASSERT_EQ(plans.size(), 3u);
  EXPECT_LE(plans[0]["tp"].get<int>() * plans[0]["cp"].get<int>(), 8) << r.out;
  EXPECT_GT(plans[0]["pp"].get<int>() * plans[0]["dp"].get<int>(), 1) << r.out;
  EXPECT_NE(r.out.find("simulated"), std::string::npos) << "a cost model is labelled as such";
  std::filesystem::remove(metrics);
}

TEST(Plan, PrintsThePublishedTableBesideItsPredictions) {
  const auto r = run_process(kPlan + " --published --top 1");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* row : {"1.7B", "18.4B", "145.6B", "1008.0B"}) EXPECT_NE(r.out.find(row), std::string::npos) << row;
  EXPECT_NE(r.out.find("largest error"), std::string::npos) << r.out;
}

// One configuration of the chapters' GPT on this machine from a calibration file (here written by the
// test: the figures are a plausible machine's, not measured), and what is wrong with one named.
TEST(Plan, PricesOneConfigurationOnACalibratedMachine) {
  planner::Calibration c;
  c.cores = 2;
  c.one_thread = {{2.8e10, 3e5}, 5e-6, 6.5e-8, 8e-6, 1.7e10};
  c.all_cores = {{4.5e10, 7e5}, 8e-5, 4.5e-8, 6e-6, 1.6e10};
  c.op_seconds = 1.6e-6;
  c.memory_bytes = 24e9;
  c.link = {1e-5, 5e9};
  const std::string dir = ::testing::TempDir(), file = dir + "/plan_calibration.json", metrics = dir + "/plan_one.jsonl";
  std::ofstream(file) << planner::to_json(c).dump();
  std::remove(metrics.c_str());
  const auto r = run_process(kPlan + " --calibration " + file + " --shape 2,64,4,8,12 --grid 1,2,2,1 --micro-batch 12 "
                             "--global-batch 48 --precision fp32 --metrics " + metrics);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("TP(2)-PP(2)-DP(1) mb 12 on this machine: 4 ranks on 2 cores: step"), std::string::npos) << r.out;
  std::ifstream in(metrics);
  std::string line;
  ASSERT_TRUE(std::getline(in, line));
  const auto j = nlohmann::json::parse(line);
  EXPECT_GT(j["step_seconds"].get<double>(), 0);
  EXPECT_GT(j["pp_seconds"].get<double>(), 0);  // two stages
  EXPECT_GT(j["tp_seconds"].get<double>(), 0);  // two TP ranks
  // A model chapter 08 refuses is refused (3 heads on a width of 64), one it trains is priced (an odd
  // sequence without context parallelism).
  const auto heads = run_process(kPlan + " --calibration " + file + " --shape 2,64,3,8,12 --grid 1,1,1,1");
  EXPECT_EQ(heads.exit_code, 2) << heads.out;
  EXPECT_NE(heads.err.find("--shape: the heads do not divide the width"), std::string::npos) << heads.err;
  const auto odd = run_process(kPlan + " --calibration " + file + " --shape 2,64,4,9,12 --grid 1,1,1,1");
  EXPECT_EQ(odd.exit_code, 0) << odd.out << odd.err;
  // Chapter 04's MLP, data parallel: its step in the same record's form (dp, step_seconds); a flag that
  // describes a GPT's configuration, a model-parallel grid or both models at once are refused.
  std::remove(metrics.c_str());
  const auto mlp = run_process(kPlan + " --calibration " + file + " --mlp 16,256,2 --grid 2,1,1,1 --global-batch 240 "
                               "--metrics " + metrics);
  ASSERT_EQ(mlp.exit_code, 0) << mlp.err;
  EXPECT_NE(mlp.out.find("MLP 16-256x2-1 DP(2), global batch 240, on this machine: 2 ranks on 2 cores: step"),
            std::string::npos) << mlp.out;
  std::ifstream mlp_in(metrics);
  ASSERT_TRUE(std::getline(mlp_in, line));
  const auto priced = nlohmann::json::parse(line);
  EXPECT_EQ(priced["model"], "mlp");
  EXPECT_EQ(priced["dp"], 2);
  EXPECT_GT(priced["dp_seconds"].get<double>(), 0);
  EXPECT_NEAR(priced["step_seconds"].get<double>(), priced["compute_seconds"].get<double>() +
                  priced["dp_seconds"].get<double>() + priced["optimizer_seconds"].get<double>(), 1e-15);
  for (const auto& [args, flag] : std::vector<std::pair<std::string, std::string>>{
           {"--mlp 16,256,2 --grid 2,2,1,1", "--grid: the MLP runs data parallel only"},
           {"--mlp 16,256,2 --grid 2,1,1,1 --micro-batch 8", "--micro-batch: prices a GPT's configuration"},
           {"--mlp 16,256,2 --grid 2,1,1,1 --precision bf16", "--precision: prices a GPT's configuration"},
           {"--mlp 16,256,2 --shape 2,64,4,8,12 --grid 2,1,1,1", "--mlp: prices the MLP in place of --shape"},
           {"--shape 2,64,4,8,12 --grid 1024,1024,1024,1024", "--grid: 1024 x 1024 x 1024 x 1024 = 1099511627776 ranks"}}) {
    const auto bad = run_process(kPlan + " --calibration " + file + " " + args);
    EXPECT_EQ(bad.exit_code, 2) << args;
    EXPECT_EQ(count_lines(bad.err), 1) << args << ": " << bad.err;
    EXPECT_NE(bad.err.find(flag), std::string::npos) << args << ": " << bad.err;
  }
  // A link fit a busy machine tilted below zero prices nothing: refused, naming --link.
  const std::string tilted = dir + "/plan_tilted_link.jsonl";
  std::ofstream(tilted) << R"({"event":"alpha_beta","alpha_us":-3.5,"beta_s_per_byte":1e-10})" << "\n";
  const auto busy = run_process(kPlan + " --calibration " + file + " --mlp 16,256,2 --grid 2,1,1,1 --link " + tilted);
  EXPECT_EQ(busy.exit_code, 2);
  EXPECT_EQ(count_lines(busy.err), 1) << busy.err;
  EXPECT_NE(busy.err.find("--link: " + tilted + "'s alpha-beta fit is not a link (alpha -3.5 us"), std::string::npos)
      << busy.err;
  nlohmann::json broken = planner::to_json(c);
  broken["one_thread"].erase("attention_seconds_per_head");
  std::ofstream(file) << broken.dump();
  const auto refused = run_process(kPlan + " --calibration " + file + " --shape 2,64,4,8,12 --grid 1,1,1,1");
  EXPECT_EQ(refused.exit_code, 2);
  EXPECT_EQ(count_lines(refused.err), 1) << refused.err;
  EXPECT_NE(refused.err.find("'attention_seconds_per_head'"), std::string::npos) << refused.err;
}

TEST(Plan, BadInputIsOneLineNamingTheFlag) {
  EXPECT_EQ(run_process(kPlan + " --help").exit_code, 0);
  for (const auto& [args, flag] : std::vector<std::pair<std::string, std::string>>{
           {"--gpus 12", "--gpus"}, {"--gpus 0", "--gpus"}, {"--model gpt5", "--model"},
           {"--global-batch 1.5", "--global-batch"}, {"--precision fp8", "--precision"}, {"--cluster tpu", "--cluster"}, {"--top 0", "--top"},
           {"--metrics /", "--metrics"}, {"--calibrate /tmp/x.json", "--calibrate"},
           {"--calibration /nonexistent.json", "--calibration"}, {"--shape 1,2,3", "--shape"}}) {
    const auto r = run_process(kPlan + " " + args);
    EXPECT_EQ(r.exit_code, 2) << args;
    EXPECT_EQ(count_lines(r.err), 1) << args << ": " << r.err;
    EXPECT_NE(r.err.find(flag), std::string::npos) << args << ": " << r.err;
  }
}

// --calibrate writes its file through a temporary made anew: a link where the file goes is refused, naming
// it, and what it points at is left as it was; a regular file there is replaced whole.
TEST(Plan, TheCalibrationIsNeverWrittenThroughALink) {
  const std::string link_fit = temp_path("plan_link.jsonl"), victim = temp_path("plan_victim.txt"),
                    placed = temp_path("plan_placed.json");
  std::ofstream(link_fit) << R"({"event": "alpha_beta", "alpha_us": 5.0, "beta_s_per_byte": 2e-10})" << "\n";
  std::ofstream(victim) << "precious";
  std::remove(placed.c_str());
  ASSERT_EQ(::symlink(victim.c_str(), placed.c_str()), 0);
  const auto refused = run_process(kPlan + " --calibrate " + placed + " --link " + link_fit);
  EXPECT_EQ(refused.exit_code, 2) << refused.out << refused.err;
  EXPECT_NE(refused.err.find("--calibrate: " + placed), std::string::npos) << refused.err;
  EXPECT_EQ(read_file(victim), "precious");
  std::remove(placed.c_str());
  std::ofstream(placed) << "an older calibration, longer than any new one could be " << std::string(10000, 'x');
  const auto written = run_process(kPlan + " --calibrate " + placed + " --link " + link_fit);
  EXPECT_EQ(written.exit_code, 0) << written.out << written.err;
  std::ifstream in(placed);
  EXPECT_FALSE(nlohmann::json::parse(in, nullptr, false).is_discarded()) << read_file(placed).substr(0, 200);
  for (const auto& path : {link_fit, victim, placed}) std::remove(path.c_str());
}

}  // namespace
}  // namespace course::testing
