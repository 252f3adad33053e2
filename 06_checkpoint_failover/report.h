// What chapter 06 reports beside its lesson: each step's time and loss, the checkpoints' cost and Young's
// interval, and at the end the checksums, --verify's verdict and the comparison with the uninterrupted
// run (bit for bit at an unchanged world size), --save and the verdict.
#pragma once
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "06_checkpoint_failover/options.h"
#include "06_checkpoint_failover/trainer.h"
#include "06_checkpoint_failover/checks.h"
#include "common/checkpoint/training_checkpoint.h"
#include "common/cli/session.h"

namespace course::chapter06 {

class Report {
 public:
  Report(const Options& o, cli::Session& session, const nn::TrainingTask& task, const data::SampleStream& stream,
         Trainer& trainer, std::int64_t global_batch);
  // Training starts (or resumes) at `start`.
  void begin(const checkpoint::Start& start);
  void begin_step() { began_ = std::chrono::steady_clock::now(); }
  // Logs the step (`check_ms`, the check's own time, left out); false when the loss is not finite (the
  // run diverged and stops, nothing saved).
  bool end_step(std::int64_t step, float loss, double check_ms);
  void saved(const checkpoint::Saved& s);
  // The report and the verdict: the exit code (0 passed, 1 failed). `check`: the run's, finished here.
  int finish(const checkpoint::TrainingState& state, verify::StepCheck& check);

 private:
  const Options& o_;
  cli::Session& session_;
  const nn::TrainingTask& task_;
  const data::SampleStream& stream_;
  Trainer& trainer_;
  comm::Communicator& group_;
  std::int64_t global_batch_;
  checkpoint::Start start_;
  std::int64_t start_step_ = 0, fault_step_ = -1;
  std::chrono::steady_clock::time_point began_;
  double step_ms_ = 0, write_ms_ = 0, written_mb_ = 0;
  std::int64_t timed_steps_ = 0;
  int checkpoints_ = 0;
  bool diverged_ = false;
  std::int64_t diverged_step_ = -1;
};

}  // namespace course::chapter06
