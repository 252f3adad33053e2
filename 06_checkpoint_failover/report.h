// What chapter 06 checks and reports beside its lesson: --verify's lock-step check against one rank
// that restored the same checkpoint on its own, --fault's broken resume, each step's time and loss,
// the checkpoints' cost and Young's interval, and at the end the checksums, the comparison with the
// uninterrupted run (bit for bit at an unchanged world size), --save and the verdict.
#pragma once
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "06_checkpoint_failover/options.h"
#include "06_checkpoint_failover/trainer.h"
#include "06_checkpoint_failover/verify_resume.h"
#include "common/checkpoint/training_checkpoint.h"
#include "common/cli/session.h"

namespace course::chapter06 {

class Diagnostics {
 public:
  Diagnostics(const Options& o, cli::Session& session, const nn::TrainingTask& task, const data::SampleStream& stream,
              Trainer& trainer, std::int64_t global_batch);
  // With --verify: restores a checkpoint the run resumes into the reference too, and keeps it for the
  // comparison at the end after a change of world size; otherwise empty.
  std::function<void(const std::string& path, const checkpoint::Loaded&)> also_restore();
  // Training starts (or resumes) at `start`: the lock-step check begins there.
  void begin(const checkpoint::Start& start);
  verify::StepCheck& check() { return *check_; }  // --verify's (verify_resume.h), or unchecked()
  // --fault, at the step it was asked for: the optimizer's state lost, or the data back one batch.
  void break_if_asked(std::int64_t step, checkpoint::TrainingState& state);
  // --fault zero-saved-moments from step K on: the checkpoints written after step K and later carry Adam's
  // second moments zeroed, as a writer's bug would write them (their digest, from memory, catches it).
  std::function<void(checkpoint::NamedTensors&)> writer_fault(std::int64_t step) const;
  void begin_step() { began_ = std::chrono::steady_clock::now(); }
  // Logs the step; false when the loss is not finite (the run diverged and stops, nothing saved).
  bool end_step(std::int64_t step, float loss);
  void saved(const checkpoint::Saved& s);
  // The report and the verdict: the exit code (0 passed, 1 failed).
  int finish(const checkpoint::TrainingState& state);

 private:
  const Options& o_;
  cli::Session& session_;
  const nn::TrainingTask& task_;
  const data::SampleStream& stream_;
  Trainer& trainer_;
  comm::Communicator& group_;
  std::int64_t global_batch_;
  ResumeCheck* resume_check_ = nullptr;  // --verify: check_, as what it is
  std::unique_ptr<verify::StepCheck> check_;
  checkpoint::Start start_;
  std::string resumed_path_;      // --verify: the checkpoint resumed, and its contents as loaded
  checkpoint::Loaded resumed_;
  std::int64_t start_step_ = 0, fault_step_ = -1;
  std::chrono::steady_clock::time_point began_;
  double step_ms_ = 0, write_ms_ = 0, written_mb_ = 0;
  std::int64_t timed_steps_ = 0;
  int checkpoints_ = 0;
  bool diverged_ = false;
};

}  // namespace course::chapter06
