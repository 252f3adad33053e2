// Every flag of every chapter, tried as a new user would: read from the chapter's --help, each numeric
// and text flag is given 0, a negative number, NaN, infinity, 1e30, 99999999999, letters, an empty
// string and no value at all; flags without a value are given one. Each run must either end within
// seconds with exit code 2 and one line naming the flag (from one rank only), or run to its verdict
// (PASSED with 0, FAILED with 1). Never a crash, a hang, another exit code or a silent wrong answer.
// Numeric flags are also given hex (refused: they are decimal) and a leading zero (read as decimal), and
// every path flag a folder, a pipe and a device (a copy of /dev/null): none may hang, and none may be
// replaced by a file. Flags added to later chapters are covered without new code.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "support/process.h"

namespace course::testing {
namespace {

// A run longer than this hangs, as far as a user is concerned: the time limit of every try.
constexpr int kSecondsPerRun = 60;
constexpr int kConcurrentTries = 4;

struct Chapter {
  std::string binary;
  std::map<std::string, std::string> base;  // flags that keep a valid run short
  bool distributed;
  std::map<std::string, std::string> excludes = {};  // a flag that may not be given with another
  // Fault-injection flags: a valid value may end the run by SIGKILL (exit code 137), as asked.
  std::set<std::string> kills = {};
  // Flags declared once in common/ and already tried with another chapter (cli::add_model_options).
  std::set<std::string> tried_elsewhere = {};
};

// The model flags (common/cli/model_options): tried with chapter 04, not again with each chapter that shares them.
const std::set<std::string> kModelFlags = {"--model",      "--n-layer", "--n-head", "--n-embd",
                                           "--block-size", "--digits",  "--data",   "--val-fraction"};

// A base value that must differ between tries (a checkpoint folder): each try gets a fresh path.
const std::string kFreshPath = "@fresh";

struct Flag {
  std::vector<std::string> names;  // e.g. -b and --minbytes
  bool takes_value;
  std::string type;  // INT, UINT, FLOAT or TEXT, as --help prints it
};

// The options listed by --help: "  -b,--minbytes TEXT=8   ..." takes a value, "  --verify   ..." does not.
std::vector<Flag> flags_of(const std::string& binary) {
  auto help = run_process(binary + " --help");
  EXPECT_EQ(help.exit_code, 0) << binary;
  std::vector<Flag> out;
  std::istringstream lines(help.out);
  const std::regex option(R"(^  ((?:-[A-Za-z0-9],)?--[a-z0-9-]+)( [A-Z]+)?)");
  for (std::string line; std::getline(lines, line);) {
    std::smatch m;
    if (!std::regex_search(line, m, option)) continue;
    Flag f{{}, m[2].matched, m[2].matched ? m[2].str().substr(1) : ""};
    std::stringstream names(m[1].str());
    for (std::string name; std::getline(names, name, ',');) f.names.push_back(name);
    if (f.names.back() != "--help") out.push_back(f);
  }
  return out;
}

std::string command(const Chapter& c, const Flag& f, const std::string& value, const std::string& launcher) {
  std::string args;
  for (const auto& [flag, v] : c.base) {
    const bool same = std::find(f.names.begin(), f.names.end(), flag) != f.names.end();
    auto excluded = c.excludes.find(f.names.back());
    if (!same && !(excluded != c.excludes.end() && excluded->second == flag))
      args += " " + flag + " " + (v == kFreshPath ? temp_path("flags_fresh") : v);
  }
  return "timeout " + std::to_string(kSecondsPerRun) + " " + launcher + " " + c.binary + args + " " + f.names.back() +
         value;
}

int error_lines(const std::string& err) {
  int n = 0;
  std::istringstream lines(err);
  for (std::string line; std::getline(lines, line);) n += line.rfind("error:", 0) == 0;
  return n;
}

struct Try {
  const Chapter* chapter;
  Flag flag;
  std::string launcher, command, value;
  ProcessResult result;
};

// No numeric flag of the course means anything by a negative number, nor an integer flag by one beyond
// 64 bits: those must be refused, never read as something else (CLI11 would wrap -1 into an unsigned
// flag and saturate the other). Text values (paths) may be anything.
bool never_valid(const Flag& f, const std::string& value) {
  if (f.type == "TEXT" || f.type.empty()) return false;
  // Numbers are decimal: hex (C's "0x10", which strtod reads as 16) is refused, never read as another number.
  return value == " -1" || value == " 0x10" || (f.type != "FLOAT" && value == " 99999999999999999999");
}

// One try: either a usage error naming the flag, or a run that reaches its verdict.
void expect_handled(const Try& t) {
  const Flag& f = t.flag;
  const std::string& launcher = t.launcher;
  const ProcessResult& r = t.result;
  SCOPED_TRACE(t.command + "\nstdout: " + r.out.substr(0, 2000) + "\nstderr: " + r.err.substr(0, 2000));
  if (never_valid(f, t.value)) {
    EXPECT_EQ(r.exit_code, 2) << "accepted" << t.value;
  }
  if (r.exit_code == 2) {
    EXPECT_EQ(error_lines(r.err), 1) << "one line, from one rank";
    bool named = false;
    for (const auto& name : f.names) named = named || r.err.find(name) != std::string::npos;
    EXPECT_TRUE(named) << "the error must name the flag";
    if (launcher.empty()) {
      EXPECT_EQ(count_lines(r.err), 1);
    }
  } else if (r.exit_code == 137 && t.chapter->kills.count(f.names.back())) {
    EXPECT_EQ(error_lines(r.err), 0);  // killed on request: a fault injected, not an error
  } else {
    ASSERT_NE(r.exit_code, 124) << "hung";
    EXPECT_TRUE(r.exit_code == 0 || r.exit_code == 1) << "exit code " << r.exit_code;
    EXPECT_NE(r.out.find(r.exit_code == 0 ? "PASSED" : "FAILED"), std::string::npos) << "no verdict";
    EXPECT_EQ(error_lines(r.err), 0);
  }
}

const std::vector<std::string> kValues = {
    " 0", " -1", " nan", " inf", " 1e30", " 99999999999", " 99999999999999999999", " abc", " ''", "", " 0x10", " 010"};

void try_every_flag(const Chapter& c) {
  // Runs write their metrics (and any file a flag names) into a scratch folder.
  auto scratch = std::filesystem::temp_directory_path() / ("course_flags_" + std::to_string(::getpid()));
  std::filesystem::create_directories(scratch);
  std::filesystem::current_path(scratch);
  auto flags = flags_of(c.binary);
  ASSERT_GE(flags.size(), 5u) << "could not read the flags from --help";
  // What a path flag may be given that is not a regular file: each must be refused or read, never
  // waited on, and never replaced; a link is never written through (what it points to stays as it was).
  const auto folder = scratch / "a_folder", pipe = scratch / "a_pipe", device = scratch / "a_device";
  const auto victim = scratch / "victim.txt", link = scratch / "a_link";
  std::filesystem::create_directories(folder);
  ASSERT_EQ(::mkfifo(pipe.c_str(), 0644), 0);
  std::ofstream(victim) << "keep me\n";
  std::filesystem::create_symlink(victim, link);
  const auto value = [](const std::filesystem::path& p) { return std::string(" ").append(p.string()); };
  std::vector<std::string> specials{value(folder), value(pipe), value(link)};
  if (::mknod(device.c_str(), S_IFCHR | 0666, ::makedev(1, 3)) == 0) specials.push_back(value(device));  // as root
  std::vector<Try> tries;
  auto add = [&](const Flag& f, const std::string& value, const std::string& launcher) {
    tries.push_back({&c, f, launcher, command(c, f, value, launcher), value, {}});
  };
  for (const auto& f : flags) {
    if (c.tried_elsewhere.count(f.names.back())) continue;
    if (!f.takes_value) {
      add(f, "=abc", "");
      if (c.distributed) add(f, "=abc", MPIRUN_NP2);
      continue;
    }
    for (const auto& value : kValues) add(f, value, "");
    if (f.type == "TEXT")
      for (const auto& special : specials) add(f, special, "");
    // Every rank fails alike, and one reports. Letters fail in parsing, before any rank talks to
    // another, exactly as in the single-process try; 0 is the value that passes parsing and must be
    // refused (or run) by all ranks together, so it is the one tried under mpirun.
    if (c.distributed) add(f, " 0", MPIRUN_NP2);
  }
  // The tries run a few at a time: most of each is process start-up, which leaves the cores idle.
  std::atomic<std::size_t> next{0};
  std::vector<std::thread> workers;
  for (int w = 0; w < kConcurrentTries; ++w)
    workers.emplace_back([&] {
      for (std::size_t i = next++; i < tries.size(); i = next++) tries[i].result = run_process(tries[i].command);
    });
  for (auto& worker : workers) worker.join();
  for (const auto& t : tries) expect_handled(t);
  EXPECT_TRUE(std::filesystem::is_fifo(pipe)) << "the pipe was replaced";
  EXPECT_TRUE(std::filesystem::is_symlink(link)) << "the link was replaced";
  std::ifstream kept(victim);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(kept), {}), "keep me\n") << "a run wrote through a link";
  EXPECT_TRUE(std::filesystem::is_directory(folder)) << "the folder was replaced";
  if (std::filesystem::exists(device)) {
    EXPECT_TRUE(std::filesystem::is_character_file(device)) << "the device was replaced";
  }
  auto unknown = run_process(c.binary + " --no-such-flag 3");
  EXPECT_EQ(unknown.exit_code, 2);
  EXPECT_EQ(count_lines(unknown.err), 1) << unknown.err;
  std::filesystem::remove_all(scratch);
}

// A flag that does nothing in a combination is refused with one line naming it and the flag that makes
// it inert (exit code 2), and the same flag in a combination where it acts runs to its verdict.
TEST(Flags, InertCombinationsAreRefusedNamingBothFlags) {
  const std::string ch04 = std::string(CHAPTER04_BINARY) + " --device cpu --steps 2 --samples 64 --global-batch 8 --hidden 8";
  const std::string ch05 = std::string(CHAPTER05_BINARY) + " --device cpu --steps 2 --layers 2 --hidden 16 --features 4 "
                           "--samples 64 --global-batch 8";
  const std::string ch06 = std::string(CHAPTER06_BINARY) + " --device cpu --steps 2 --hidden 8 --samples 64 --global-batch 8";
  const std::string ch07 = std::string(CHAPTER07_BINARY) + " --device cpu --steps 2 --hidden 8 --layers 2 --global-batch 8";
  const std::string ch08 = std::string(CHAPTER08_BINARY) + " --device cpu --steps 2 --global-batch 8 --micro-batches 2 "
                           "--n-layer 2 --n-embd 16 --n-head 2";
  const std::string np2 = std::string(MPIRUN_NP2) + " ";
  const auto scratch = std::filesystem::temp_directory_path() / ("course_inert_" + std::to_string(::getpid()));
  std::filesystem::create_directories(scratch);
  const std::string link = (scratch / "link.jsonl").string();
  std::ofstream(link) << "{}\n";
  // A calibration as benchmarks/plan --calibrate writes one (its figures this machine's order of magnitude).
  const std::string calibration = (scratch / "calibration.json").string();
  std::ofstream(calibration) << R"({"cores": 2, "op_seconds": 1e-6, "memory_bytes": 8e9, "alpha_seconds": 2e-6,
    "link_bytes_per_second": 5e9, "one_thread": {"linear_flops_per_second": 5e10, "linear_half_rate_flops": 1e6,
    "elementwise_seconds_per_element": 3e-8, "attention_seconds_per_head": 8e-6, "bandwidth": 1e10},
    "all_cores": {"linear_flops_per_second": 1e11, "linear_half_rate_flops": 2e6,
    "elementwise_seconds_per_element": 2e-8, "attention_seconds_per_head": 5e-6, "bandwidth": 2e10}})";
  struct Case {
    std::string command, flag, other;
  };
  const std::vector<Case> refused = {
      {ch04 + " --loss-scale 1024", "--loss-scale", "--precision"},
      {ch05 + " --loss-scale 1024 --precision bf16", "--loss-scale", "--precision"},
      {ch06 + " --ckpt-dir " + (scratch / "a").string() + " --loss-scale 1024", "--loss-scale", "--precision"},
      {ch07 + " --loss-scale 1024", "--loss-scale", "--precision"},
      {ch08 + " --loss-scale 1024", "--loss-scale", "--precision"},
      {ch06 + " --ckpt-dir " + (scratch / "b").string() + " --verify --fault repeat-batch", "--fault", "--resume"},
      // A fault with nothing to catch it: the run would train wrong and end PASSED.
      {ch04 + " --fault average-twice", "--fault", "--verify"},
      {ch05 + " --fault skip-bucket", "--fault", "--verify"},
      {ch06 + " --ckpt-dir " + (scratch / "c").string() + " --fault repeat-batch --fault-from-step 1", "--fault", "--verify"},
      {ch07 + " --fault skip-rank-share", "--fault", "--verify"},
      {ch08 + " --fault lose-micro-batch", "--fault", "--verify"},
      {ch07 + " --stage 1 --prefetch", "--prefetch", "--stage"},
      // A fault that acts only at 2 ranks or more, at one (ch04 is one rank here).
      {ch04 + " --verify --fault average-twice", "--fault", "two or more ranks"},
      // A fault that acts only at 3 ranks or more, at one.
      {ch06 + " --ckpt-dir " + (scratch / "d").string() + " --verify --fault skewed-share --fault-from-step 1", "--fault",
       "3 data-parallel ranks or more"},
      {ch08 + " --schedule gpipe", "--schedule", "--pp"},
      {ch08 + " --cp-method ulysses", "--cp-method", "--cp"},
      {ch08 + " --model mlp --cp-method ulysses", "--cp-method", "--model"},
      {ch08 + " --reduce-dtype bf16", "--reduce-dtype", "--dp"},
      {np2 + ch08 + " --tp 2 --reduce-dtype bf16", "--reduce-dtype", "--dp"},
      {std::string(PLAN_BINARY) + " --shape 2,64,4,16,64", "--shape", "--calibration"},
      {std::string(PLAN_BINARY) + " --grid 1,1,1,1", "--grid", "--calibration"},
      {std::string(PLAN_BINARY) + " --link " + link, "--link", "--calibrat"},
      {std::string(BENCH_STEP_BINARY) + " --sdpa flash", "--sdpa", "--model"},
      // 05's prediction prices the MLP's float32 buckets: not the GPT, 16-bit steps or 16-bit buckets.
      {ch05 + " --predict " + calibration + " --model gpt", "--predict", "--model"},
      {ch05 + " --predict " + calibration + " --precision bf16", "--predict", "--precision"},
      {ch05 + " --predict " + calibration + " --comm-hook bf16", "--predict", "--comm-hook"},
      {ch05 + " --predict " + link, "--predict", "cores"},
      // 07's prices float32 steps of the MLP on the device, one micro-batch a step, on this machine's link.
      {ch07 + " --predict " + calibration + " --precision bf16", "--predict", "--precision"},
      {ch07 + " --predict " + calibration + " --offload optimizer", "--predict", "--offload"},
      {ch07 + " --predict " + calibration + " --accum 2", "--predict", "--accum"},
      {ch07 + " --predict " + calibration + " --sim-network 10,1.25", "--predict", "--sim-network"},
      {ch07 + " --predict " + calibration + " --model gpt", "--predict", "--model"}};
  for (const Case& c : refused) {
    const auto r = run_process(c.command);
    EXPECT_EQ(r.exit_code, 2) << c.command << "\n" << r.out << r.err;
    EXPECT_EQ(error_lines(r.err), 1) << c.command << "\n" << r.err;
    EXPECT_NE(r.err.find("error: " + c.flag + ": "), std::string::npos) << c.command << "\n" << r.err;
    EXPECT_NE(r.err.find(c.other), std::string::npos) << c.command << ": does not name " << c.other << "\n" << r.err;
  }
  // Where each acts, the same flag runs.
  for (const std::string& command :
       {ch05 + " --loss-scale 1024 --precision fp16", ch05 + " --predict " + calibration,
        np2 + ch05 + " --predict " + calibration + " --sim-network 10,1.25", ch07 + " --stage 3 --prefetch",
        np2 + ch07 + " --compare --predict " + calibration,
        np2 + ch08 + " --pp 2 --schedule gpipe", np2 + ch08 + " --cp 2 --cp-method ulysses",
        np2 + ch08 + " --reduce-dtype bf16",
        std::string(BENCH_STEP_BINARY) + " --model gpt --sdpa flash --batch 2 --steps 1 --warmup 0"}) {
    const auto r = run_process(command);
    EXPECT_EQ(r.exit_code, 0) << command << "\n" << r.out << r.err;
  }
  std::filesystem::remove_all(scratch);
}

TEST(Flags, Chapter01) {
  try_every_flag({CHAPTER01_BINARY, {{"--device", "cpu"}, {"--epochs", "1"}, {"--samples", "64"}}, false});
}
TEST(Flags, Chapter02) {
  try_every_flag({CHAPTER02_BINARY, {{"--device", "cpu"}, {"--epochs", "1"}, {"--samples", "64"}}, false});
}
TEST(Flags, Chapter03) {
  try_every_flag({CHAPTER03_BINARY, {{"--device", "cpu"}, {"-e", "64"}, {"-n", "1"}, {"-w", "0"}}, true});
}
TEST(Flags, Chapter04) {
  try_every_flag(
      {CHAPTER04_BINARY,
       {{"--device", "cpu"}, {"--steps", "2"}, {"--samples", "64"}, {"--global-batch", "8"}, {"--hidden", "8"}},
       true,
       {{"--epochs", "--steps"}}});
}

TEST(Flags, Chapter05) {
  try_every_flag({CHAPTER05_BINARY,
                  {{"--device", "cpu"},
                   {"--steps", "2"},
                   {"--layers", "2"},
                   {"--hidden", "16"},
                   {"--features", "4"},
                   {"--samples", "64"},
                   {"--global-batch", "8"}},
                  true,
                  {},
                  {},
                  kModelFlags});
}

TEST(Flags, Chapter06) {
  try_every_flag({CHAPTER06_BINARY,
                  {{"--device", "cpu"},
                   {"--steps", "2"},
                   {"--ckpt-every", "1"},
                   {"--hidden", "8"},
                   {"--samples", "64"},
                   {"--global-batch", "8"},
                   {"--ckpt-dir", kFreshPath}},
                  true,
                  {},
                  {"--fail-at-step"}});
}

TEST(Flags, Chapter07) {
  try_every_flag({CHAPTER07_BINARY,
                  {{"--device", "cpu"}, {"--steps", "2"}, {"--hidden", "8"}, {"--layers", "2"}, {"--global-batch", "8"}},
                  true,
                  {},
                  {},
                  kModelFlags});
}

TEST(Flags, Chapter08) {
  try_every_flag({CHAPTER08_BINARY,
                  {{"--device", "cpu"}, {"--steps", "2"}, {"--global-batch", "8"}, {"--micro-batches", "2"},
                   {"--n-layer", "2"}, {"--n-embd", "16"}, {"--n-head", "2"}},
                  true,
                  {},
                  {},
                  kModelFlags});
}

// OMP_NUM_THREADS and OPENBLAS_NUM_THREADS read whole, as libgomp reads them: "1e3" and "3abc" are no
// counts (atoi read 1 and 3), nor is one past the cores a process may have; each is one line naming the
// variable, exit 2. A count is obeyed.
TEST(EnvironmentVariables, ThreadCountsAreReadWhole) {
  const std::string ch04 = std::string(CHAPTER04_BINARY) + " --device cpu --steps 1 --samples 64 --global-batch 8 --hidden 8";
  for (const std::string setting : {"OMP_NUM_THREADS=1e3", "OPENBLAS_NUM_THREADS=3abc", "OMP_NUM_THREADS=2147483648",
                                    "OMP_NUM_THREADS=1025", "OMP_NUM_THREADS=-2"}) {
    const auto r = run_process(setting + " " + ch04);
    EXPECT_EQ(r.exit_code, 2) << setting << "\n" << r.out << r.err;
    EXPECT_EQ(error_lines(r.err), 1) << setting << "\n" << r.err;
    const std::string name = setting.substr(0, setting.find('='));
    EXPECT_NE(r.err.find("error: " + name + ": '" + setting.substr(setting.find('=') + 1) +
                         "' is not a number of threads from 1 to 1024"), std::string::npos) << r.err;
  }
  const auto two = run_process("OMP_NUM_THREADS=2 " + ch04);
  EXPECT_EQ(two.exit_code, 0) << two.err;
  EXPECT_NE(two.out.find("cpu: 2 threads"), std::string::npos) << two.out;
}

}  // namespace
}  // namespace course::testing
