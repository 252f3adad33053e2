// Every multi-rank chapter across two "nodes" on this machine (scripts/two_nodes.sh: a hostfile of two
// hosts, an Open MPI daemon for each, TCP between the ranks), against the same run on one node: the
// chapter sees two machines, passes --verify where it has it, and ends on the same bits (its saved
// parameters byte for byte, or chapter 08's losses at every step).
#include <gtest/gtest.h>

#include "support/process.h"

namespace course::testing {
namespace {

const std::string kTwoNodes = TWO_NODES_SH;
constexpr int kRanks = 4;  // two a node

struct Runs {
  ProcessResult one, two;
};

// The same command on one node (mpirun -np 4) and on two (two_nodes.sh 4).
Runs both(const std::string& binary, const std::string& args) {
  return {run_process(std::string(MPIRUN_NP4) + " " + binary + " " + args),
          run_process(kTwoNodes + " " + std::to_string(kRanks) + " " + binary + " " + args)};
}

void expect_two_machines(const Runs& r) {
  EXPECT_EQ(r.one.exit_code, 0) << r.one.out << r.one.err;
  EXPECT_EQ(r.two.exit_code, 0) << r.two.out << r.two.err;
  EXPECT_NE(r.two.out.find("4 ranks on 2 machines"), std::string::npos) << r.two.out << r.two.err;
  EXPECT_EQ(r.one.out.find("machines"), std::string::npos) << "one node is one machine\n" << r.one.out;
}

// 04, 05, 06 and 07 save their final parameters: the two files must be the same bytes.
void expect_same_parameters(const std::string& binary, const std::string& args) {
  SCOPED_TRACE(binary + " " + args);
  const std::string one = temp_path("one.safetensors"), two = temp_path("two.safetensors");
  const Runs r{run_process(std::string(MPIRUN_NP4) + " " + binary + " " + args + " --save " + one),
               run_process(kTwoNodes + " " + std::to_string(kRanks) + " " + binary + " " + args + " --save " + two)};
  expect_two_machines(r);
  if (args.find("--verify") != std::string::npos) {
    EXPECT_NE(r.two.out.find("PASSED"), std::string::npos) << r.two.out;
  }
  const std::string a = read_file(one), b = read_file(two);
  EXPECT_FALSE(a.empty());
  EXPECT_TRUE(a == b) << "the parameters differ between one node and two";
  std::remove(one.c_str());
  std::remove(two.c_str());
}

TEST(TwoNodes, Chapter04DataParallelIsTheSameBits) {
  expect_same_parameters(CHAPTER04_BINARY, "--device cpu --steps 20 --verify");
}

TEST(TwoNodes, Chapter05BucketsAreTheSameBits) {
  expect_same_parameters(CHAPTER05_BINARY, "--device cpu --steps 10 --layers 2 --hidden 32 --verify");
}

TEST(TwoNodes, Chapter06CheckpointedTrainingIsTheSameBits) {
  const std::string one = temp_path("ckpt_one"), two = temp_path("ckpt_two");
  const std::string args = "--device cpu --steps 10 --ckpt-every 5 --verify --ckpt-dir ";
  Runs r{run_process(std::string(MPIRUN_NP4) + " " + CHAPTER06_BINARY + " " + args + one + " --save " + one + ".st"),
         run_process(kTwoNodes + " 4 " + CHAPTER06_BINARY + " " + args + two + " --save " + two + ".st")};
  expect_two_machines(r);
  EXPECT_NE(r.two.out.find("PASSED"), std::string::npos) << r.two.out;
  EXPECT_TRUE(read_file(one + ".st") == read_file(two + ".st"));
  EXPECT_FALSE(read_file(two + ".st").empty());
  for (const auto& path : {one, two}) {
    std::filesystem::remove_all(path);
    std::filesystem::remove(path + ".st");
  }
}

TEST(TwoNodes, Chapter07ZeroStage3IsTheSameBits) {
  expect_same_parameters(CHAPTER07_BINARY, "--device cpu --steps 10 --stage 3 --verify");
}

// TP inside each node (ranks 0-1 and 2-3), PP across the two.
TEST(TwoNodes, Chapter08TensorInsideAPipelineAcrossPassesVerify) {
  const std::string one = temp_path("one.jsonl"), two = temp_path("two.jsonl");
  const std::string args = "--device cpu --tp 2 --pp 2 --steps 5 --log-every 1 --verify --metrics ";
  Runs r{run_process(std::string(MPIRUN_NP4) + " " + CHAPTER08_BINARY + " " + args + one),
         run_process(kTwoNodes + " 4 " + CHAPTER08_BINARY + " " + args + two)};
  expect_two_machines(r);
  EXPECT_NE(r.two.out.find("PASSED"), std::string::npos) << r.two.out;
  const auto a = events(read_metrics(one), "step"), b = events(read_metrics(two), "step");
  ASSERT_EQ(a.size(), 5u);
  ASSERT_EQ(b.size(), 5u);
  for (std::size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i]["loss"], b[i]["loss"]) << "step " << i;
  std::remove(one.c_str());
  std::remove(two.c_str());
}

TEST(TwoNodes, Chapter03CollectivesRun) {
  expect_two_machines(both(CHAPTER03_BINARY, "--device cpu -e 64 -n 1 -w 0"));
}

}  // namespace
}  // namespace course::testing
