// The one interface of --verify: the check's clock, and the check of a run without it.
#include "common/verify/step_check.h"

#include <chrono>

#include "common/core/log.h"
#include "common/faults/faults.h"

namespace course::verify {

namespace {

// Adds the time `work` takes to `ms`.
template <class Work>
void timed(double& ms, Work&& work) {
  const auto begin = std::chrono::steady_clock::now();
  work();
  ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - begin).count();
}

}  // namespace

// The loop's markers are also the fault plan's (faults.h): the step a --fault sees is the one begun
// here, and what it does after an update happens before the check judges that update.
void StepCheck::begin_step(std::int64_t step) {
  faults::begin_step(step);
  timed(ms_, [&] { on_begin_step(step); });
}
void StepCheck::check_gradient(std::int64_t step, float loss) { timed(ms_, [&] { on_check_gradient(step, loss); }); }
void StepCheck::check_update(std::int64_t step, double norm) {
  faults::end_step(step);
  timed(ms_, [&] { on_check_update(step, norm); });
}
LockstepSummary StepCheck::finish() {
  LockstepSummary summary;
  timed(ms_, [&] { summary = on_finish(); });
  return summary;
}

namespace {

class Unchecked final : public StepCheck {
 public:
  bool checks() const override { return false; }

 protected:
  void on_begin_step(std::int64_t) override {}
  void on_check_gradient(std::int64_t, float) override {}
  void on_check_update(std::int64_t, double) override {}
  LockstepSummary on_finish() override { return {}; }
};

}  // namespace

std::unique_ptr<StepCheck> unchecked() { return std::make_unique<Unchecked>(); }

LockstepSummary finish_diverged(StepCheck& check, std::int64_t diverged_step) {
  LockstepSummary summary = check.finish();
  if (!summary.passed && summary.first_failed_step < diverged_step) {
    log("lock-step check FAILED at step %lld, before training diverged at step %lld: %s\n",
        static_cast<long long>(summary.first_failed_step), static_cast<long long>(diverged_step),
        summary.first_failure.c_str());
    return summary;
  }
  log("lock-step check: every step before the divergence at step %lld held\n", static_cast<long long>(diverged_step));
  return LockstepSummary{};
}

}  // namespace course::verify
