// --verify behind one interface. A chapter's lock-step check (lockstep.h: the single-rank run of the same
// computation, restarted every step from the run's own parameters) is called at a step's three points,
// and its own time is kept apart, for the run to leave out of its step time. Without --verify a chapter
// holds `unchecked()` (check_if), which does nothing, so its loop reads the same either way:
//
//   check->begin_step(step);              // the parameters: the ones the reference predicted?
//   ... forward, backward, the gradients averaged ...
//   check->check_gradient(step, loss);    // the gradients (and loss): the reference's over the global batch?
//   ... clip, step ...
//   check->check_update(step, norm);      // the update: the optimizer's formula's from those gradients?
//   ...
//   summary = check->finish();            // the final parameters: the last prediction?
//
// Each chapter's check (05's, 07's, 08's) says what its reference computes and how close it must be.
// begin_step and check_update also mark the step for the run's --fault (common/faults/faults.h).
#pragma once
#include <cstdint>
#include <memory>
#include <utility>

#include "common/verify/lockstep.h"  // LockstepSummary

namespace course::verify {

class StepCheck {
 public:
  virtual ~StepCheck() = default;
  void begin_step(std::int64_t step);
  // After the gradients are averaged, before clipping. In fp16 a check unscales them first
  // (Recipe::unscale_, which the step would call next: once either way), as one reads a GradScaler's
  // gradients in PyTorch. `loss` as the chapter's check says (the step's over the global batch, or this
  // rank's). Collective.
  void check_gradient(std::int64_t step, float loss);
  // After the optimizer's step; `norm`: the gradients' norm before clipping (0 without clipping).
  void check_update(std::int64_t step, double norm);
  // The final parameters against the last prediction, and the verdict. Collective.
  LockstepSummary finish();
  // The milliseconds the calls above took since the last call of this: the check's own work.
  double take_ms() { return std::exchange(ms_, 0.0); }
  // False for unchecked(): there is no verdict to report.
  virtual bool checks() const { return true; }

 protected:
  virtual void on_begin_step(std::int64_t step) = 0;
  virtual void on_check_gradient(std::int64_t step, float loss) = 0;
  virtual void on_check_update(std::int64_t step, double norm) = 0;
  virtual LockstepSummary on_finish() = 0;

 private:
  double ms_ = 0;
};

// A run that diverged at `diverged_step` (its loss not finite) still hears where lock-step failed first,
// when that was before: a bug that blows training up is named at its step, not taken for a learning rate
// too high. Logs one line (rank 0) and returns the summary (passed when nothing failed before the
// divergence). Collective, as finish() is.
LockstepSummary finish_diverged(StepCheck& check, std::int64_t diverged_step);

// A run without --verify: every call does nothing (and takes no time).
std::unique_ptr<StepCheck> unchecked();

// make() when `verify`, else unchecked(): check_if(o.verify, [&] { return std::make_unique<MyCheck>(...); }).
template <class Make>
std::unique_ptr<StepCheck> check_if(bool verify, Make make) {
  if (!verify) return unchecked();
  return make();
}

}  // namespace course::verify
