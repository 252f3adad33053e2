// Chapter 06 graded from the outside: a stopped and resumed run, a run whose rank is killed and
// restarted by the launcher, and a run killed while writing a checkpoint all finish bit-identical to the
// uninterrupted run; a checkpoint saved at 4 ranks resumes at 2 (and the reverse) and passes the
// lock-step check from the step it resumed at; a resume that loses the optimizer's state or replays a
// batch fails at that step, and so does the same fault begun late in an uninterrupted run; every kind of
// damaged checkpoint is named and skipped, never loaded; a checkpoint is readable from Python's
// standard library; bad input exits 2 with one line. The GPT, trained with AdamW and its schedule,
// survives a killed rank bit for bit and a change of world size in lock-step.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include "common/checkpoint/safetensors.h"
#include "support/gpu_runs.h"
#include "support/process.h"

namespace course::testing {
namespace {

namespace fs = std::filesystem;
const std::string kBinary = CHAPTER06_BINARY;
// A small run: 48 samples a step over 512 (a test's 40 steps are almost four epochs), a checkpoint
// every 10 steps. A test's own value of one of these flags replaces it.
const std::vector<std::pair<std::string, std::string>> kSmall = {{"--device", "cpu"},      {"--samples", "512"},
                                                                 {"--global-batch", "48"}, {"--hidden", "32"},
                                                                 {"--ckpt-every", "10"},   {"--keep", "5"}};

std::string with_defaults(const std::string& args) {
  std::string all;
  for (const auto& [flag, value] : kSmall)
    if (args.find(flag + " ") == std::string::npos) all += " " + flag + " " + value;
  return all + " " + args;
}

struct Outcome {
  ProcessResult process;
  nlohmann::json summary;  // the failover_summary record, or null
};

Outcome run(const std::string& launcher, const std::string& args) {
  const std::string metrics = temp_path("ch06.jsonl");
  Outcome r;
  r.process = run_process(launcher + " " + kBinary + with_defaults(args) + " --metrics " + metrics);
  auto summary = events(read_metrics(metrics), "failover_summary");
  if (!summary.empty()) r.summary = summary.back();
  std::remove(metrics.c_str());
  return r;
}

std::string fresh_folder() {
  const std::string dir = temp_path("ch06_ckpt");
  fs::remove_all(dir);
  return dir;
}

void expect_passed(const Outcome& r) {
  EXPECT_EQ(r.process.exit_code, 0) << r.process.out << r.process.err;
  EXPECT_NE(r.process.out.find("PASSED"), std::string::npos) << r.process.out;
  ASSERT_FALSE(r.summary.is_null()) << r.process.out << r.process.err;
  EXPECT_TRUE(r.summary["passed"].get<bool>());
  EXPECT_TRUE(r.summary["identical"].get<bool>());
}

// The checksums of the uninterrupted run of `steps` at `launcher`'s world size.
nlohmann::json uninterrupted(const std::string& launcher, int steps) {
  Outcome r = run(launcher, "--ckpt-dir " + fresh_folder() + " --steps " + std::to_string(steps));
  expect_passed(r);
  return r.summary;
}

void expect_same_result(const nlohmann::json& a, const nlohmann::json& b) {
  EXPECT_EQ(a["checksum"].get<std::uint64_t>(), b["checksum"].get<std::uint64_t>());
  EXPECT_EQ(a["optimizer_checksum"].get<std::uint64_t>(), b["optimizer_checksum"].get<std::uint64_t>());
  EXPECT_EQ(a["steps"].get<int>(), b["steps"].get<int>());
}

// Every tensor and the training position of two checkpoint files, bit for bit.
void expect_same_checkpoint(const std::string& a, const std::string& b) {
  auto x = checkpoint::load_safetensors(a), y = checkpoint::load_safetensors(b);
  ASSERT_EQ(x.tensors.size(), y.tensors.size());
  for (std::size_t i = 0; i < x.tensors.size(); ++i) {
    EXPECT_EQ(x.tensors[i].first, y.tensors[i].first);
    EXPECT_EQ(x.tensors[i].second.to_host(), y.tensors[i].second.to_host()) << x.tensors[i].first;
  }
  for (const char* key : {"step", "samples_seen", "optimizer_step", "model_config_hash"})
    EXPECT_EQ(x.metadata.at(key), y.metadata.at(key)) << key;
}

TEST(Chapter06, StopAndResumeIsBitIdentical) {
  const auto reference = uninterrupted(MPIRUN_NP2, 40);
  const std::string whole = fresh_folder(), halves = fresh_folder();
  expect_passed(run(MPIRUN_NP2, "--ckpt-dir " + whole + " --steps 40"));
  expect_passed(run(MPIRUN_NP2, "--ckpt-dir " + halves + " --steps 20"));
  Outcome second = run(MPIRUN_NP2, "--ckpt-dir " + halves + " --steps 40 --resume --verify");
  expect_passed(second);
  EXPECT_NE(second.process.out.find("resumed from step 20"), std::string::npos) << second.process.out;
  EXPECT_NE(second.process.out.find("bit-identical"), std::string::npos) << second.process.out;
  EXPECT_EQ(second.summary["max_diff"].get<double>(), 0.0);
  EXPECT_EQ(second.summary["optimizer_max_diff"].get<double>(), 0.0);
  expect_same_result(second.summary, reference);
  // The final checkpoints hold the same parameters, Adam moments and position, bit for bit.
  expect_same_checkpoint(whole + "/step_00000040.safetensors", halves + "/step_00000040.safetensors");
  // --keep 5 of the 4 written: all there, and `latest` names the newest.
  EXPECT_EQ(read_file(halves + "/latest"), "step_00000040.safetensors\n");
}

// fp16: the loss scale decides whether the next steps skip (2^30 is far too large: the first steps
// overflow and skip while it backs off). It is saved with the rest, so a run stopped at step 20 and
// resumed ends bit-identical to the uninterrupted one, and in lock-step; a resume that restarted the
// scale would skip those steps again.
TEST(Chapter06, AnFp16ResumeKeepsTheLossScale) {
  const std::string fp16 = " --precision fp16 --loss-scale 1073741824";
  const std::string whole = fresh_folder(), halves = fresh_folder();
  Outcome reference = run(MPIRUN_NP2, "--ckpt-dir " + whole + " --steps 40" + fp16);
  expect_passed(reference);
  expect_passed(run(MPIRUN_NP2, "--ckpt-dir " + halves + " --steps 20" + fp16));
  auto saved = checkpoint::load_safetensors(halves + "/step_00000020.safetensors");
  const auto skipped = std::stoll(saved.metadata.at("loss_scale_skipped_steps"));
  EXPECT_GT(skipped, 0);
  EXPECT_LT(skipped, 20);  // it backed off and trained before the stop
  EXPECT_EQ(std::stoll(saved.metadata.at("optimizer_step")) + skipped, 20);
  Outcome second = run(MPIRUN_NP2, "--ckpt-dir " + halves + " --steps 40 --resume --verify" + fp16);
  expect_passed(second);
  expect_same_result(second.summary, reference.summary);
  expect_same_checkpoint(whole + "/step_00000040.safetensors", halves + "/step_00000040.safetensors");
  // A checkpoint of the fp16 run is another run's for an fp32 one.
  Outcome other = run(MPIRUN_NP2, "--ckpt-dir " + halves + " --steps 50 --resume");
  EXPECT_NE(other.process.exit_code, 0) << other.process.out;
}

TEST(Chapter06, KeepDeletesTheOldest) {
  const std::string dir = fresh_folder();
  expect_passed(run(MPIRUN_NP2, "--ckpt-dir " + dir + " --steps 40 --keep 2"));
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  // The newest two, the pointer, and the lock that keeps a second job out of the folder.
  EXPECT_EQ(names, (std::vector<std::string>{".lock", "latest", "step_00000030.safetensors", "step_00000040.safetensors"}));
}

TEST(Chapter06, TheLauncherRecoversFromAKilledRank) {
  const auto reference = uninterrupted(MPIRUN_NP2, 40);
  const std::string dir = fresh_folder(), metrics = temp_path("ch06_failover.jsonl");
  auto r = run_process(std::string("python3 ") + FAILOVER_PY + " --np 2 --max-restarts 2 -- " + kBinary +
                       with_defaults("--ckpt-dir " + dir + " --steps 40 --fail-at-step 25 --fail-rank 1 --verify") +
                       " --metrics " + metrics);
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("failover: attempt 1 failed: exit code 137: a rank was killed by signal 9"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("failover: attempt 2 resumed from step 20"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("failover: finished after 1 restart"), std::string::npos) << r.out;
  auto summary = events(read_metrics(metrics), "failover_summary");
  ASSERT_EQ(summary.size(), 1u);  // the killed attempt never got to its summary
  EXPECT_TRUE(summary[0]["passed"].get<bool>());
  EXPECT_EQ(summary[0]["start_step"].get<int>(), 20);
  EXPECT_EQ(summary[0]["restart_count"].get<int>(), 1);
  expect_same_result(summary[0], reference);
}

// The launcher as torchrun's: a job that mpirun could not start at all is not retried, nor one that ran
// to a FAILED verdict; SIGTERM sent to the launcher reaches the job, which ends at once, and the launcher
// ends too, without a restart.
TEST(Chapter06, TheLauncherPassesSignalsOnAndDoesNotRetryALaunchFailure) {
  auto missing = run_process(std::string("python3 ") + FAILOVER_PY + " --np 2 --max-restarts 3 -- /nonexistent/program");
  EXPECT_NE(missing.exit_code, 0);
  EXPECT_NE(missing.out.find("mpirun could not start the job"), std::string::npos) << missing.out;
  EXPECT_EQ(missing.out.find("attempt 2"), std::string::npos) << missing.out;
  // A launcher that is not there: a usage error naming --mpirun (exit code 2), not a traceback.
  auto no_mpirun = run_process(std::string("python3 ") + FAILOVER_PY + " --np 1 --mpirun /nonexistent/mpirun -- /bin/true");
  EXPECT_EQ(no_mpirun.exit_code, 2) << no_mpirun.out << no_mpirun.err;
  EXPECT_NE(no_mpirun.err.find("--mpirun: /nonexistent/mpirun is not a program that can be run"), std::string::npos)
      << no_mpirun.err;
  EXPECT_EQ(no_mpirun.err.find("Traceback"), std::string::npos) << no_mpirun.err;
  // A run that ends in a FAILED verdict found a wrong result: not a crash, not retried.
  auto failed = run_process(std::string("python3 ") + FAILOVER_PY + " --np 2 -- " + kBinary +
                            with_defaults("--ckpt-dir " + fresh_folder() + " --steps 8 --verify --fault repeat-batch "
                                          "--fault-from-step 5"));
  EXPECT_EQ(failed.exit_code, 1) << failed.out << failed.err;
  EXPECT_NE(failed.out.find("the job ran to its verdict, FAILED (exit code 1)"), std::string::npos) << failed.out;
  EXPECT_EQ(failed.out.find("attempt 2"), std::string::npos) << failed.out;
  // SIGTERM once the job has said it trains (its step 0), not after a sleep; then, the launcher gone, no
  // rank alive (a zombie waiting to be reaped aside): looked for until gone, for at most a minute.
  const std::string dir = fresh_folder(), pid_file = temp_path("ch06_launcher_pid");
  const std::string rank_alive = "ps -eo stat=,args= | grep -v '^Z' | grep -q -- '^[^ ]* */[^ ]*[0]6_checkpoint_failover "
                                 ".*--ckpt-dir " + dir + " '";
  auto stopped = run_process_when(
      // The launcher writes its own pid before it becomes the launcher (exec), so the file is there first.
      "( sh -c 'echo $$ >" + pid_file + "; exec python3 " + FAILOVER_PY + " --np 2 -- " + kBinary +
          with_defaults("--ckpt-dir " + dir + " --steps 1000000 --log-every 1000000") +
          "' & launcher=$!; wait $launcher; echo \"launcher exit $?\"; for i in $(seq 600); do " + rank_alive +
          " || break; sleep 0.1; done; " + rank_alive + " && echo 'job still running' || echo 'job gone' )",
      "step    0", [&pid_file] {
        const pid_t launcher = static_cast<pid_t>(std::stol(read_file(pid_file)));
        ::kill(launcher, SIGTERM);
      });
  std::remove(pid_file.c_str());
  EXPECT_NE(stopped.out.find("stopped by SIGTERM, passed to the job"), std::string::npos) << stopped.out;
  EXPECT_NE(stopped.out.find("launcher exit 143"), std::string::npos) << stopped.out;
  EXPECT_NE(stopped.out.find("job gone"), std::string::npos) << stopped.out;
  EXPECT_EQ(stopped.out.find("attempt 2"), std::string::npos) << stopped.out;
}

// A kill during the very first checkpoint leaves only a temporary; the restart, with nothing to resume
// from, starts afresh and removes it. A `latest` that is not a file is refused at start-up.
TEST(Chapter06, WhatADeadWriterLeftIsRemovedAndALatestFolderRefused) {
  const std::string dir = fresh_folder();
  fs::create_directories(dir);
  std::ofstream(dir + "/.step_00000010.safetensors.tmp.99999") << "half a checkpoint";
  Outcome fresh = run(MPIRUN_NP2, "--ckpt-dir " + dir + " --steps 10");
  expect_passed(fresh);
  EXPECT_NE(fresh.process.out.find("removed .step_00000010.safetensors.tmp.99999"), std::string::npos) << fresh.process.out;
  EXPECT_FALSE(fs::exists(dir + "/.step_00000010.safetensors.tmp.99999"));
  const std::string other = fresh_folder();
  fs::create_directories(other + "/latest");
  Outcome refused = run(MPIRUN_NP2, "--ckpt-dir " + other + " --steps 10");
  EXPECT_EQ(refused.process.exit_code, 2) << refused.process.out;
  EXPECT_NE(refused.process.err.find("latest is not a regular file"), std::string::npos) << refused.process.err;
}

// Something in the way of a later checkpoint (a folder, a pipe or a link where the file goes) is found
// before training, not after 20 steps when that checkpoint is due: exit code 2 naming it, nothing trained
// and nothing removed. A name the run will not write (step 35 at --ckpt-every 10) is not in its way.
TEST(Chapter06, SomethingInTheWayOfALaterCheckpointIsRefusedBeforeTraining) {
  const std::string dir = fresh_folder();
  expect_passed(run(MPIRUN_NP2, "--ckpt-dir " + dir + " --steps 20 --ckpt-every 10"));
  std::ofstream(dir + "/.step_00000030.safetensors.tmp.4242") << "half";
  for (const std::string kind : {"folder", "pipe", "link"}) {
    const std::string blocked = dir + "/step_00000040.safetensors";
    if (kind == "folder") {
      fs::create_directories(blocked);
    } else if (kind == "pipe") {
      ASSERT_EQ(::mkfifo(blocked.c_str(), 0600), 0);
    } else {
      fs::create_symlink(dir + "/step_00000020.safetensors", blocked);
    }
    Outcome refused = run(MPIRUN_NP2, "--ckpt-dir " + dir + " --steps 40 --ckpt-every 10 --resume");
    EXPECT_EQ(refused.process.exit_code, 2) << kind << "\n" << refused.process.out << refused.process.err;
    EXPECT_NE(refused.process.err.find("--ckpt-dir: " + blocked + " is in the way of a checkpoint this run will write"),
              std::string::npos) << kind << ": " << refused.process.err;
    EXPECT_EQ(refused.process.out.find("step "), std::string::npos) << kind << ": trained before refusing\n"
                                                                     << refused.process.out;
    EXPECT_TRUE(fs::exists(dir + "/.step_00000030.safetensors.tmp.4242")) << kind << ": removed by a run that refused";
    fs::remove_all(blocked);
  }
  fs::create_directories(dir + "/step_00000035.safetensors");
  Outcome free = run(MPIRUN_NP2, "--ckpt-dir " + dir + " --steps 40 --ckpt-every 10 --resume");
  EXPECT_EQ(free.process.exit_code, 0) << free.process.out << free.process.err;
}

// One job at a time in a folder: a job that finds another's lock (here this test's, standing for a
// killed job whose ranks are still ending) waits for it, and goes on once it is let go; held on, the
// folder is refused (exit code 2) after the wait, with nothing trained.
TEST(Chapter06, AJobWaitsForTheLockOfOneStillEndingAndRefusesALiveOne) {
  const std::string dir = fresh_folder();
  expect_passed(run(MPIRUN_NP2, "--ckpt-dir " + dir + " --steps 10"));
  const int fd = ::open((dir + "/.lock").c_str(), O_RDWR | O_CREAT, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::flock(fd, LOCK_EX), 0);
  // Let go once the job says it waits (not after a sleep: a slow start would never wait).
  Outcome waited;
  const std::string metrics = temp_path("ch06_waited.jsonl");
  waited.process = run_process_when(std::string(MPIRUN_NP2) + " " + kBinary +
                                        with_defaults("--ckpt-dir " + dir + " --steps 20 --resume") + " --metrics " + metrics,
                                    "waiting for another job's lock on " + dir, [fd] { ::flock(fd, LOCK_UN); });
  if (auto summary = events(read_metrics(metrics), "failover_summary"); !summary.empty()) waited.summary = summary.back();
  std::remove(metrics.c_str());
  expect_passed(waited);
  EXPECT_NE(waited.process.out.find("waiting for another job's lock on " + dir), std::string::npos) << waited.process.out;
  ASSERT_EQ(::flock(fd, LOCK_EX), 0);
  Outcome refused = run(MPIRUN_NP2, "--ckpt-dir " + dir + " --steps 30 --resume");
  EXPECT_EQ(refused.process.exit_code, 2) << refused.process.out << refused.process.err;
  EXPECT_NE(refused.process.err.find("--ckpt-dir: " + dir + " is in use by another job"), std::string::npos)
      << refused.process.err;
  EXPECT_EQ(refused.process.out.find("resumed"), std::string::npos) << refused.process.out;
  ::close(fd);
}

// A .lock that cannot be the lock (a folder, a link to a file elsewhere or to nothing, a pipe) is refused,
// never skipped (two jobs would write one folder) nor followed (a link would lock, or create, a file
// anywhere); and a folder's dead writer's temporaries stay while it is refused.
TEST(Chapter06, ALockThatCannotBeTheLockIsRefused) {
  for (const std::string kind : {"folder", "link", "dangling link", "pipe"}) {
    for (const bool resume : {false, true}) {
      const std::string dir = fresh_folder(), elsewhere = temp_path("ch06_lock_target_" + std::to_string(resume));
      fs::remove(elsewhere);
      if (resume) expect_passed(run(MPIRUN_NP2, "--ckpt-dir " + dir + " --steps 10"));
      fs::create_directories(dir);
      fs::remove_all(dir + "/.lock");
      std::ofstream(dir + "/.step_00000030.safetensors.tmp.4242") << "half";
      if (kind == "folder") fs::create_directories(dir + "/.lock");
      if (kind == "link") std::ofstream(elsewhere) << "someone's file";
      if (kind == "link" || kind == "dangling link") fs::create_symlink(elsewhere, dir + "/.lock");
      if (kind == "pipe") {
        ASSERT_EQ(::mkfifo((dir + "/.lock").c_str(), 0600), 0);
      }
      Outcome refused = run(MPIRUN_NP2, "--ckpt-dir " + dir + " --steps 20" + (resume ? " --resume" : ""));
      const std::string what = kind + (resume ? ", resumed" : ", fresh");
      EXPECT_EQ(refused.process.exit_code, 2) << what << "\n" << refused.process.out << refused.process.err;
      EXPECT_NE(refused.process.err.find("--ckpt-dir: " + dir + "/.lock is not a lock this job can hold"),
                std::string::npos) << what << ": " << refused.process.err;
      EXPECT_EQ(refused.process.out.find("step "), std::string::npos) << what << ": trained\n" << refused.process.out;
      EXPECT_TRUE(fs::exists(dir + "/.step_00000030.safetensors.tmp.4242")) << what << ": removed by a run that refused";
      if (kind == "link") {
        std::ifstream in(elsewhere);
        std::string kept;
        std::getline(in, kept);
        EXPECT_EQ(kept, "someone's file") << what;
      }
      if (kind == "dangling link") {
        EXPECT_FALSE(fs::exists(elsewhere)) << what << ": the link's target was created";
      }
      fs::remove(elsewhere);
    }
  }
}

// Killed halfway through the very first checkpoint: nothing to resume from, the restart starts afresh,
// removes the temporary, and ends bit-identical to the uninterrupted run.
TEST(Chapter06, AKillDuringTheFirstSaveRecoversFromTheStart) {
  const std::string reference_dir = fresh_folder();
  Outcome reference = run(MPIRUN_NP2, "--ckpt-dir " + reference_dir + " --steps 30");
  expect_passed(reference);
  const std::string dir = fresh_folder(), metrics = temp_path("ch06_first.jsonl");
  auto r = run_process(std::string("python3 ") + FAILOVER_PY + " --np 2 -- " + kBinary +
                       with_defaults("--ckpt-dir " + dir + " --steps 30 --fail-at-step 10 --fail-during-save --verify") +
                       " --metrics " + metrics);
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("restarting with 2 ranks, from the start (no checkpoint yet)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("removed .step_00000010.safetensors.tmp."), std::string::npos) << r.out;
  auto summary = events(read_metrics(metrics), "failover_summary");
  ASSERT_EQ(summary.size(), 1u);
  expect_same_result(summary[0], reference.summary);
}

TEST(Chapter06, AKillDuringASaveLeavesThePreviousCheckpoint) {
  const auto reference = uninterrupted(MPIRUN_NP2, 40);
  const std::string dir = fresh_folder();
  Outcome killed = run(MPIRUN_NP2, "--ckpt-dir " + dir + " --steps 40 --fail-at-step 20 --fail-during-save");
  EXPECT_NE(killed.process.exit_code, 0);
  EXPECT_TRUE(killed.summary.is_null());
  // The step-20 file never appeared; its half-written temporary did, and `latest` still names step 10.
  EXPECT_FALSE(fs::exists(dir + "/step_00000020.safetensors"));
  EXPECT_EQ(read_file(dir + "/latest"), "step_00000010.safetensors\n");
  int partial = 0;
  for (const auto& e : fs::directory_iterator(dir))
    partial += checkpoint::is_partial_write(e.path().filename().string());
  EXPECT_EQ(partial, 1);
  EXPECT_NO_THROW(checkpoint::load_safetensors(dir + "/step_00000010.safetensors"));

  Outcome resumed = run(MPIRUN_NP2, "--ckpt-dir " + dir + " --steps 40 --resume --verify");
  expect_passed(resumed);
  EXPECT_NE(resumed.process.out.find("what a checkpoint writer that died left behind"), std::string::npos) << resumed.process.out;
  EXPECT_NE(resumed.process.out.find("resumed from step 10"), std::string::npos) << resumed.process.out;
  expect_same_result(resumed.summary, reference);
  for (const auto& e : fs::directory_iterator(dir))
    EXPECT_FALSE(checkpoint::is_partial_write(e.path().filename().string()));
}

// A sampler wrong only at the new world size (--fault skewed-share: at 3 ranks or more one sample twice,
// one never). The run, its lock-step reference and the uninterrupted twin all cut their shares with it,
// so only the data order, held against the global batch alone, sees it: at the step it begins, the
// resume's own, a late one and the last.
TEST(Chapter06, ASamplerWrongAtTheNewWorldSizeFailsAtItsStep) {
  for (const int from : {20, 31, 39}) {
    const std::string dir = fresh_folder();
    expect_passed(run(MPIRUN_NP2, "--ckpt-dir " + dir + " --steps 20"));
    Outcome resumed = run(MPIRUN_NP4, "--ckpt-dir " + dir + " --steps 40 --resume --verify --fault skewed-share" +
                                          (from == 20 ? std::string() : " --fault-from-step " + std::to_string(from)));
    EXPECT_EQ(resumed.process.exit_code, 1) << resumed.process.out << resumed.process.err;
    EXPECT_NE(resumed.process.out.find("lock-step FAILED at step " + std::to_string(from) + ": the data order: sample "),
              std::string::npos) << resumed.process.out;
    EXPECT_NE(resumed.process.out.find("is taken 2 time(s) by rank 0, rank 3, not 1"), std::string::npos)
        << resumed.process.out;
  }
}

TEST(Chapter06, ElasticResumePassesInLockStep) {
  for (const auto& [before, after] : {std::pair{MPIRUN_NP4, MPIRUN_NP2}, std::pair{MPIRUN_NP2, MPIRUN_NP4}}) {
    const std::string dir = fresh_folder();
    expect_passed(run(before, "--ckpt-dir " + dir + " --steps 20"));
    // Growing to 4 ranks, the resumed run averages its gradients in bf16 (--reduce-dtype), verified
    // against the bound of 16-bit sums.
    const bool sixteen = after == std::string(MPIRUN_NP4);
    Outcome resumed = run(after, "--ckpt-dir " + dir + " --steps 40 --resume --verify" + (sixteen ? " --reduce-dtype bf16" : ""));
    expect_passed(resumed);
    EXPECT_NE(resumed.process.out.find(sixteen ? "within its bfloat16 bound" : "within its float32 bound"), std::string::npos)
        << resumed.process.out;
    EXPECT_FALSE(resumed.summary["same_world"].get<bool>());
    EXPECT_TRUE(resumed.summary["lockstep_passed"].get<bool>());
    EXPECT_NE(resumed.process.out.find("verify: steps 20-39 in lock-step"), std::string::npos) << resumed.process.out;
    EXPECT_NE(resumed.process.out.find("verify: world sizes "), std::string::npos) << resumed.process.out;
    // And against a run at the new world size that never stopped after the checkpoint: the same bits.
    EXPECT_NE(resumed.process.out.find("uninterrupted from the checkpoint of step 20: parameters and optimizer state "
                                       "bit-identical"), std::string::npos) << resumed.process.out;
    EXPECT_EQ(resumed.summary["max_diff"].get<double>(), 0.0);
    // A resume that takes the data from the wrong place differs from it, as it fails the lock-step check.
    Outcome broken = run(after, "--ckpt-dir " + dir + " --steps 60 --resume --verify --fault repeat-batch");
    EXPECT_EQ(broken.process.exit_code, 1) << broken.process.out << broken.process.err;
    EXPECT_NE(broken.process.out.find("uninterrupted from the checkpoint of step 40: parameters and optimizer state "
                                      "DIFFER"), std::string::npos) << broken.process.out;
  }
}

TEST(Chapter06, VerifyCatchesABrokenResumeAtTheStepItResumed) {
  // A resume that forgets Adam's moments, or replays a batch, fails at the step it resumed at: at the
  // same world size and after a change of world size.
  for (const auto& [fault, before] : {std::pair<std::string, const char*>{"lose-optimizer-state", MPIRUN_NP2},
                                      std::pair<std::string, const char*>{"repeat-batch", MPIRUN_NP4}}) {
    const std::string dir = fresh_folder();
    expect_passed(run(before, "--ckpt-dir " + dir + " --steps 20"));
    Outcome broken = run(MPIRUN_NP2, "--ckpt-dir " + dir + " --steps 40 --resume --verify --fault " + fault);
    EXPECT_EQ(broken.process.exit_code, 1) << fault << broken.process.out;
    EXPECT_NE(broken.process.out.find("lock-step FAILED at step 20: "), std::string::npos) << broken.process.out;
    ASSERT_FALSE(broken.summary.is_null());
    EXPECT_FALSE(broken.summary["passed"].get<bool>());
    EXPECT_EQ(broken.summary["first_failed_step"].get<int>(), 20);
  }
}

TEST(Chapter06, VerifyCatchesAFaultThatBeginsLate) {
  // The same faults begun at a late step of a run that never stopped: caught at that step. Step 0 has
  // nothing of a previous step to lose, so it is refused.
  for (const auto& [fault, from] : {std::pair<std::string, int>{"lose-optimizer-state", 70}, {"repeat-batch", 99}}) {
    const std::string dir = fresh_folder();
    Outcome broken = run(MPIRUN_NP2, "--ckpt-dir " + dir + " --steps 100 --ckpt-every 50 --verify --fault " + fault +
                                         " --fault-from-step " + std::to_string(from));
    EXPECT_EQ(broken.process.exit_code, 1) << fault << broken.process.out;
    EXPECT_EQ(broken.summary["first_failed_step"].get<int>(), from) << broken.process.out;
    // What such a run wrote still loads: a state its loader would reject is never written.
    Outcome again = run(MPIRUN_NP2, "--ckpt-dir " + dir + " --steps 110 --ckpt-every 50 --resume");
    expect_passed(again);
    EXPECT_NE(again.process.out.find("resumed from step 100"), std::string::npos) << again.process.out;
  }
  Outcome refused = run(MPIRUN_NP2, "--ckpt-dir " + fresh_folder() + " --verify --fault repeat-batch --fault-from-step 0");
  EXPECT_EQ(refused.process.exit_code, 2);
  EXPECT_NE(refused.process.err.find("--fault-from-step"), std::string::npos) << refused.process.err;
}

// A fault from a step before the one a run resumes at would never act, and the run would pass as if it
// had been caught nowhere: refused, naming the flag and the step resumed at; the checkpoints stay.
TEST(Chapter06, AFaultBeforeTheResumedStepIsRefused) {
  const std::string dir = fresh_folder();
  expect_passed(run(MPIRUN_NP2, "--ckpt-dir " + dir + " --steps 20 --ckpt-every 10"));
  Outcome refused = run(MPIRUN_NP2, "--ckpt-dir " + dir + " --steps 30 --resume --verify --fault repeat-batch "
                                    "--fault-from-step 5");
  EXPECT_EQ(refused.process.exit_code, 2) << refused.process.out << refused.process.err;
  EXPECT_NE(refused.process.err.find("--fault-from-step: step 5 is before step 20, where this run resumes"),
            std::string::npos) << refused.process.err;
  EXPECT_TRUE(fs::exists(dir + "/step_00000020.safetensors"));
  // From the step resumed at, or later, it acts and is caught there.
  Outcome late = run(MPIRUN_NP2, "--ckpt-dir " + dir + " --steps 30 --resume --verify --fault repeat-batch "
                                 "--fault-from-step 25");
  EXPECT_EQ(late.process.exit_code, 1) << late.process.out << late.process.err;
  EXPECT_NE(late.process.out.find("lock-step FAILED at step 25: "), std::string::npos) << late.process.out;
}

// A checkpoint's checksum covers the bytes written, so a writer that zeroes Adam's second moments writes a
// file whose checksum matches. The digest of the state in memory catches it at that save (step 30's, the
// first after step 25): the run stops with one line naming the file, nothing of it is written, and the
// checkpoints before it stay good. A file written so by another writer (its checksum recomputed) is
// rejected at resume, at another world size too, and the run resumes from the one before, in lock-step.
TEST(Chapter06, ACheckpointWrittenWrongIsCaughtAtItsSaveAndRejectedAtResume) {
  const std::string dir = fresh_folder();
  Outcome wrong = run(MPIRUN_NP2, "--ckpt-dir " + dir + " --steps 40 --fault zero-saved-moments --fault-from-step 25");
  EXPECT_EQ(wrong.process.exit_code, 1) << wrong.process.out << wrong.process.err;
  EXPECT_NE(wrong.process.err.find("step_00000030.safetensors: its values do not give the digest of the training "
                                   "state it was saved from"),
            std::string::npos) << wrong.process.err;
  EXPECT_TRUE(fs::exists(dir + "/step_00000020.safetensors"));
  EXPECT_FALSE(fs::exists(dir + "/step_00000030.safetensors"));
  Outcome resumed = run(MPIRUN_NP2, "--ckpt-dir " + dir + " --steps 40 --resume --verify");
  expect_passed(resumed);
  EXPECT_NE(resumed.process.out.find("resumed from step 20"), std::string::npos) << resumed.process.out;

  // Step 20's file rewritten with its second moments zeroed, its metadata as it was, a new checksum.
  const std::string pristine = fresh_folder();
  expect_passed(run(MPIRUN_NP2, "--ckpt-dir " + pristine + " --steps 20"));
  const std::string newest = pristine + "/step_00000020.safetensors";
  auto loaded = checkpoint::load_safetensors(newest);
  int zeroed = 0;
  for (auto& [name, t] : loaded.tensors)
    if (name.find(".exp_avg_sq") != std::string::npos) t = Tensor::zeros(t.shape()), ++zeroed;
  ASSERT_GT(zeroed, 0);
  checkpoint::save_safetensors(newest, loaded.tensors, loaded.metadata);
  EXPECT_TRUE(checkpoint::load_safetensors(newest).checksummed);  // as far as the bytes go, a good file
  Outcome elastic = run(MPIRUN_NP4, "--ckpt-dir " + pristine + " --steps 30 --resume --verify");
  expect_passed(elastic);
  EXPECT_NE(elastic.process.out.find("rejected " + newest + ": its values do not give the digest"), std::string::npos)
      << elastic.process.out;
  EXPECT_NE(elastic.process.out.find("resumed from step 10"), std::string::npos) << elastic.process.out;
}

// ---- the GPT: the same guarantees for the model the later chapters train ------------------------------

// A small GPT on 512 addition problems, trained with AdamW, its warm-up and cosine schedule and clipping:
// more state than Adam's moments alone decides each step, and the checkpoint must carry all of it.
std::string gpt_flags(int n_embd) {
  return " --model gpt --n-layer 1 --n-head 2 --n-embd " + std::to_string(n_embd) + " --samples 512 ";
}
const std::string kGpt = gpt_flags(32);

TEST(Chapter06Gpt, TheLauncherRecoversBitIdentical) {
  const std::string reference_dir = fresh_folder();
  Outcome reference = run(MPIRUN_NP2, kGpt + "--ckpt-dir " + reference_dir + " --steps 30");
  expect_passed(reference);
  const std::string dir = fresh_folder(), metrics = temp_path("ch06_gpt.jsonl");
  auto r = run_process(std::string("python3 ") + FAILOVER_PY + " --np 2 --max-restarts 1 -- " + kBinary +
                       with_defaults(kGpt + "--ckpt-dir " + dir + " --steps 30 --fail-at-step 25 --fail-rank 1 --verify") +
                       " --metrics " + metrics);
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("failover: attempt 2 resumed from step 20"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("bit-identical"), std::string::npos) << r.out;
  const auto records = read_metrics(metrics);
  auto summary = events(records, "failover_summary");
  ASSERT_EQ(summary.size(), 1u);
  EXPECT_TRUE(summary[0]["passed"].get<bool>());
  expect_same_result(summary[0], reference.summary);
  // The checkpoint recorded the GPT's configuration, and the trained GPT was evaluated on held-out sums.
  const auto loaded = checkpoint::load_safetensors(dir + "/step_00000030.safetensors");
  EXPECT_NE(loaded.metadata.at("model_config").find("\"n_embd\":32"), std::string::npos);
  EXPECT_EQ(loaded.metadata.at("optimizer"), "adamw");
  auto evaluation = events(records, "evaluation");
  ASSERT_EQ(evaluation.size(), 1u);
  EXPECT_EQ(evaluation[0]["metric"], "held-out exact match");
  expect_same_checkpoint(reference_dir + "/step_00000030.safetensors", dir + "/step_00000030.safetensors");
}

TEST(Chapter06Gpt, ElasticResumeInLockStep) {
  // 4 ranks lose one at step 25; the job goes on at 2 from the checkpoint of step 20.
  const std::string dir = fresh_folder();
  Outcome killed = run(MPIRUN_NP4, kGpt + "--ckpt-dir " + dir + " --steps 40 --fail-at-step 25 --fail-rank 3");
  EXPECT_NE(killed.process.exit_code, 0);
  Outcome resumed = run(MPIRUN_NP2, kGpt + "--ckpt-dir " + dir + " --steps 40 --resume --verify");
  expect_passed(resumed);
  EXPECT_NE(resumed.process.out.find("resumed from step 20"), std::string::npos) << resumed.process.out;
  EXPECT_FALSE(resumed.summary["same_world"].get<bool>());
  EXPECT_TRUE(resumed.summary["lockstep_passed"].get<bool>());
  // A resume that forgets AdamW's moments is caught, after the same change of world size.
  const std::string again = fresh_folder();
  run(MPIRUN_NP4, kGpt + "--ckpt-dir " + again + " --steps 40 --fail-at-step 25 --fail-rank 3");
  Outcome broken = run(MPIRUN_NP2, kGpt + "--ckpt-dir " + again + " --steps 40 --resume --verify "
                                          "--fault lose-optimizer-state");
  EXPECT_EQ(broken.process.exit_code, 1) << broken.process.out;
  EXPECT_NE(broken.process.out.find("lock-step FAILED at step 20: "), std::string::npos) << broken.process.out;
}

TEST(Chapter06Gpt, AnotherScheduleOrModelIsNeverLoaded) {
  // The learning rate follows a schedule over --steps: resuming with other --steps, or another GPT,
  // would silently be another run.
  const std::string dir = fresh_folder();
  expect_passed(run(MPIRUN_NP2, kGpt + "--ckpt-dir " + dir + " --steps 20"));
  Outcome longer = run(MPIRUN_NP2, kGpt + "--ckpt-dir " + dir + " --steps 40 --resume");
  EXPECT_EQ(longer.process.exit_code, 2) << longer.process.out;
  EXPECT_NE(longer.process.out.find("was saved by another run: --steps: 40 differs from the checkpoint's 20"),
            std::string::npos) << longer.process.out;
  Outcome wider = run(MPIRUN_NP2, gpt_flags(64) + "--ckpt-dir " + dir + " --steps 20 --resume");
  EXPECT_EQ(wider.process.exit_code, 2) << wider.process.out;
  EXPECT_NE(wider.process.out.find("was saved by another run: --n-embd: 64 differs from the checkpoint's 32"),
            std::string::npos) << wider.process.out;
  Outcome mlp = run(MPIRUN_NP2, "--ckpt-dir " + dir + " --steps 20 --resume");
  EXPECT_EQ(mlp.process.exit_code, 2) << mlp.process.out;
  EXPECT_NE(mlp.process.out.find("was saved by another run: --model: mlp differs from the checkpoint's gpt"),
            std::string::npos) << mlp.process.out;
  // Another precision is named as the flag and both values, not as both runs' settings.
  Outcome bf16 = run(MPIRUN_NP2, kGpt + "--ckpt-dir " + dir + " --steps 20 --resume --precision bf16");
  EXPECT_EQ(bf16.process.exit_code, 2) << bf16.process.out;
  EXPECT_NE(bf16.process.err.find("the last: " + dir + "/step_00000010.safetensors: was saved by another run: "
                                  "--precision: bf16 differs from the checkpoint's fp32)"),
            std::string::npos) << bf16.process.err;
}

// ---- damaged checkpoints ------------------------------------------------------------------------------

std::string read_bytes(const std::string& path) { return read_file(path); }
void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// The file's JSON header, edited by `edit`, written back with its new length before the same data.
void edit_header(const std::string& path, const std::function<void(nlohmann::json&)>& edit) {
  std::string file = read_bytes(path);
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(file[static_cast<std::size_t>(i)]);
  auto header = nlohmann::json::parse(file.substr(8, n));
  edit(header);
  std::string text = header.dump();
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[static_cast<std::size_t>(i)] = static_cast<char>((text.size() >> (8 * i)) & 0xFF);
  write_bytes(path, out + text + file.substr(8 + n));
}

struct Damage {
  std::string name;
  std::function<void(const std::string& path)> apply;
  std::string reason;  // what the rejection line must say
};

const std::vector<Damage>& damages() {
  static const std::vector<Damage> all = {
      {"truncated", [](const std::string& p) { fs::resize_file(p, fs::file_size(p) / 2); }, "outside the data section"},
      {"cut to 5 bytes", [](const std::string& p) { fs::resize_file(p, 5); }, "is truncated"},
      {"header length past the end",
       [](const std::string& p) {
         std::string f = read_bytes(p);
         f[5] = '\x7f';
         write_bytes(p, f);
       },
       "runs past the end of the file"},
      {"invalid JSON",
       [](const std::string& p) {
         std::string f = read_bytes(p);
         f[8] = '[';
         write_bytes(p, f);
       },
       "header is not valid JSON"},
      {"flipped data byte",
       [](const std::string& p) {
         std::string f = read_bytes(p);
         f[f.size() - 3] ^= 0x10;
         write_bytes(p, f);
       },
       "checksum mismatch"},
      {"flipped header byte",  // a digit of the step in the metadata: still valid JSON
       [](const std::string& p) {
         std::string f = read_bytes(p);
         const auto at = f.find("\"step\":\"20\"");
         ASSERT_NE(at, std::string::npos);
         f[at + 9] = '1';
         write_bytes(p, f);
       },
       "checksum mismatch"},
      {"offsets out of range",
       [](const std::string& p) {
         edit_header(p, [](nlohmann::json& h) { h["0.weight"]["data_offsets"][1] = 1u << 30; });
       },
       "outside the data section"},
      {"unknown dtype",
       [](const std::string& p) { edit_header(p, [](nlohmann::json& h) { h["0.weight"]["dtype"] = "F33"; }); },
       "has dtype \"F33\""},
  };
  return all;
}

TEST(Chapter06, EveryDamagedCheckpointIsNamedAndSkipped) {
  const auto reference = uninterrupted(MPIRUN_NP2, 30);
  const std::string pristine = fresh_folder();
  expect_passed(run(MPIRUN_NP2, "--ckpt-dir " + pristine + " --steps 20"));
  for (const auto& damage : damages()) {
    SCOPED_TRACE(damage.name);
    const std::string dir = fresh_folder();
    fs::copy(pristine, dir);
    const std::string newest = dir + "/step_00000020.safetensors";
    damage.apply(newest);
    EXPECT_THROW(checkpoint::load_safetensors(newest), checkpoint::CheckpointError);
    Outcome r = run(MPIRUN_NP2, "--ckpt-dir " + dir + " --steps 30 --resume --verify");
    expect_passed(r);
    EXPECT_NE(r.process.out.find("rejected " + newest + ": "), std::string::npos) << r.process.out;
    EXPECT_NE(r.process.out.find(damage.reason), std::string::npos) << r.process.out;
    EXPECT_NE(r.process.out.find("resumed from step 10"), std::string::npos) << r.process.out;
    expect_same_result(r.summary, reference);  // the fallback still ends where the uninterrupted run does
  }
}

TEST(Chapter06, ALatestPointerToAMissingFileFallsBackToTheNewest) {
  const std::string dir = fresh_folder();
  expect_passed(run(MPIRUN_NP2, "--ckpt-dir " + dir + " --steps 20"));
  write_bytes(dir + "/latest", "step_00000099.safetensors\n");
  Outcome r = run(MPIRUN_NP2, "--ckpt-dir " + dir + " --steps 30 --resume --verify");
  expect_passed(r);
  EXPECT_NE(r.process.out.find("names step_00000099.safetensors, which is missing"), std::string::npos)
      << r.process.out;
  EXPECT_NE(r.process.out.find("resumed from step 20"), std::string::npos) << r.process.out;
}

// Exit code 2 and one "error:" line, from one rank (mpirun adds its own notice after it).
void expect_usage_error(const ProcessResult& r, const std::string& message) {
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  int errors = 0;
  std::istringstream lines(r.err);
  for (std::string line; std::getline(lines, line);) errors += line.rfind("error:", 0) == 0;
  EXPECT_EQ(errors, 1) << r.err;
  EXPECT_NE(r.err.find(message), std::string::npos) << r.err;
}

TEST(Chapter06, NothingGoodToResumeFromFailsCleanly) {
  const std::string dir = fresh_folder();
  expect_passed(run(MPIRUN_NP2, "--ckpt-dir " + dir + " --steps 20"));
  // Another model: every checkpoint is rejected, each named, and nothing is loaded.
  Outcome other = run(MPIRUN_NP2, "--ckpt-dir " + dir + " --steps 30 --resume --hidden 16");
  expect_usage_error(other.process, "--resume: no good checkpoint in " + dir);
  EXPECT_NE(other.process.out.find("was saved by another run: --hidden: 16 differs from the checkpoint's 32"),
            std::string::npos) << other.process.out;
  EXPECT_TRUE(other.summary.is_null());
  // Every checkpoint damaged.
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".safetensors") fs::resize_file(e.path(), 100);
  expect_usage_error(run(MPIRUN_NP2, "--ckpt-dir " + dir + " --steps 30 --resume").process,
                     "--resume: no good checkpoint in " + dir);
  // An empty folder, a missing one.
  const std::string empty = fresh_folder();
  fs::create_directories(empty);
  expect_usage_error(run(MPIRUN_NP2, "--ckpt-dir " + empty + " --resume").process,
                     "--resume: no checkpoint in " + empty);
  expect_usage_error(run(MPIRUN_NP2, "--ckpt-dir " + empty + "/missing --resume").process, "does not exist");
}

TEST(Chapter06, PythonReadsACheckpointWithTheStandardLibrary) {
  const std::string dir = fresh_folder();
  expect_passed(run(MPIRUN_NP2, "--ckpt-dir " + dir + " --steps 10"));
  const std::string path = dir + "/step_00000010.safetensors";
  auto r = run_process(std::string("python3 ") + READ_SAFETENSORS_PY + " " + path);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto loaded = checkpoint::load_safetensors(path);
  // Each tensor's line: name, dtype, shape and the values, which must be ours to the last bit
  // (Python prints the shortest repr that reads back to the same float).
  std::map<std::string, std::string> lines;  // name -> the rest of its line
  std::istringstream out(r.out);
  for (std::string line; std::getline(out, line);) lines[line.substr(0, line.find(' '))] = line;
  for (const auto& [name, tensor] : loaded.tensors) {
    ASSERT_TRUE(lines.count(name)) << name;
    const std::string& line = lines[name];
    const auto shape_begin = line.find('['), shape_end = line.find(']');
    ASSERT_EQ(line.substr(0, shape_begin), name + " F32 ");
    std::string shape;
    for (std::size_t i = 0; i < tensor.shape().size(); ++i)
      shape += (i ? ", " : "") + std::to_string(tensor.shape()[i]);
    EXPECT_EQ(line.substr(shape_begin + 1, shape_end - shape_begin - 1), shape) << name;
    const auto values_begin = line.find('[', shape_end);
    std::stringstream values(line.substr(values_begin + 1, line.rfind(']') - values_begin - 1));
    const auto ours = tensor.to_host();
    std::size_t i = 0;
    for (std::string v; std::getline(values, v, ','); ++i) {
      ASSERT_LT(i, ours.size()) << name;
      EXPECT_EQ(std::stof(v), ours[i]) << name << "[" << i << "]";
    }
    EXPECT_EQ(i, ours.size()) << name;
  }
  EXPECT_NE(r.out.find("optimizer.0.exp_avg F32"), std::string::npos);
  EXPECT_NE(r.out.find("\nstep 10\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\nworld_size 2\n"), std::string::npos) << r.out;
}

TEST(Chapter06, BadInputIsOneLineAndExitCodeTwo) {
  const std::string dir = fresh_folder();
  expect_usage_error(run(MPIRUN_NP2, "--ckpt-dir " + dir + " --ckpt-every 0").process, "--ckpt-every");
  expect_usage_error(run(MPIRUN_NP2, "--ckpt-dir " + dir + " --keep 0").process, "--keep");
  expect_usage_error(run(MPIRUN_NP2, "--ckpt-dir " + dir + " --fail-at-step 5 --fail-rank 2").process,
                     "--fail-rank: 2 is outside the world of 2 ranks");
  expect_usage_error(run(MPIRUN_NP2, "--ckpt-dir " + dir + " --fail-at-step 5 --fail-during-save").process,
                     "--fail-during-save");
  expect_usage_error(run(MPIRUN_NP2, "--ckpt-dir " + dir + " --steps 10 --fail-at-step 10").process,
                     "--fail-at-step: 10 is never reached");
  expect_passed(run(MPIRUN_NP2, "--ckpt-dir " + dir + " --steps 10"));
  // A fresh run never overwrites another run's checkpoints.
  expect_usage_error(run(MPIRUN_NP2, "--ckpt-dir " + dir + " --steps 10").process, "already holds checkpoints");
  expect_usage_error(run(MPIRUN_NP2, "--ckpt-dir " + dir + " --steps 5 --resume").process,
                     "--steps: 5 is fewer than the checkpoint's 10");
  expect_usage_error(run(MPIRUN_NP2, "--ckpt-dir " + dir + " --steps 20 --resume --global-batch 24").process,
                     "--global-batch: 24 differs from the checkpoint's 48");
  // The launcher does not retry a usage error, and gives up after --max-restarts.
  auto usage = run_process(std::string("python3 ") + FAILOVER_PY + " --np 2 -- " + kBinary +
                           with_defaults("--ckpt-dir " + dir + " --keep 0"));
  EXPECT_EQ(usage.exit_code, 2) << usage.out;
  EXPECT_NE(usage.out.find("restarting would not help"), std::string::npos) << usage.out;
  auto gave_up = run_process(std::string("python3 ") + FAILOVER_PY + " --np 2 --max-restarts 0 -- " + kBinary +
                             with_defaults("--ckpt-dir " + fresh_folder() + " --steps 20 --fail-at-step 5"));
  EXPECT_EQ(gave_up.exit_code, 1) << gave_up.out;
  EXPECT_NE(gave_up.out.find("failover: gave up after 0 restarts"), std::string::npos) << gave_up.out;
}

// On a GPU: checkpoints and lock-step, one rank on NCCL and two sharing the GPU on MPI (the GPT in bf16), a
// rank killed and recovered by the launcher, and optimizer state lost from a late step caught at that step.
TEST(Chapter06, RunsOnTheGpuThroughAFailureAndInLockStep) {
  const std::string mlp = " --samples 512 --hidden 32", run = " --global-batch 48 --ckpt-every 20 --verify --ckpt-dir ";
  expect_gpu_runs(kBinary, {{MPIRUN_NP1, one_rank_on_nccl() + mlp + run + fresh_folder() + " --steps 60"},
                            {MPIRUN_NP2, "--backend mpi" + gpt_flags(16) + run + fresh_folder() + " --steps 60 --precision bf16"},
                            {std::string("python3 ") + FAILOVER_PY + " --np 2 --max-restarts 2 --",
                             "--backend mpi" + mlp + run + fresh_folder() + " --steps 60 --fail-at-step 30 --fail-rank 1"},
                            {MPIRUN_NP2, "--backend mpi" + mlp + run + fresh_folder() +
                                             " --steps 100 --fault lose-optimizer-state --fault-from-step 70",
                             70}});
}

}  // namespace
}  // namespace course::testing
