// Chapter 06's checks, figures and verdict.
#include "06_checkpoint_failover/report.h"

#include <cmath>

#include "common/checkpoint/parameters.h"
#include "common/cli/model_options.h"
#include "common/core/log.h"
#include "common/core/memory.h"
#include "common/parallel/replicas.h"
#include "common/verify/compare.h"

namespace course::chapter06 {

Report::Report(const Options& o, cli::Session& session, const nn::TrainingTask& task, const data::SampleStream& stream,
               Trainer& trainer, std::int64_t global_batch)
    : o_(o), session_(session), task_(task), stream_(stream), trainer_(trainer),
      group_(session.topology->dp_group()), global_batch_(global_batch) {}

void Report::begin(const checkpoint::Start& start) {
  start_ = start;
  start_step_ = start.state.step;
  // --fault breaks the resume itself, or with --fault-from-step K the run at step K.
  if (o_.faults.fault != "none")
    fault_step_ = o_.fault_step_given ? o_.faults.from_step : (o_.checkpoints.resume ? start_step_ : -1);
  if (o_.kill.armed()) log("fault injection: %s\n", o_.kill.describe().c_str());
}

bool Report::end_step(std::int64_t step, float loss, double checked_ms) {
  if (step > start_step_) {  // the first step warms up allocators and caches
    step_ms_ += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - began_).count() - checked_ms;
    ++timed_steps_;
  }
  if (!std::isfinite(loss)) {  // nothing diverged is ever saved: the last checkpoint stays the newest
    log("step %4lld  loss %g: training diverged; lower the learning rate (--lr %g)\n", static_cast<long long>(step),
        loss, o_.training.lr);
    diverged_ = true;
    diverged_step_ = step;
    return false;
  }
  if (step % o_.log_every == 0 || step + 1 == o_.training.steps) {
    log("step %4lld  loss %.6f\n", static_cast<long long>(step), loss);
    session_.metrics.write({{"event", "step"}, {"step", step}, {"loss", loss}});
  }
  return true;
}

void Report::saved(const checkpoint::Saved& s) {
  write_ms_ += s.ms;
  written_mb_ += static_cast<double>(s.bytes) / 1e6;
  if (s.bytes > 0) ++checkpoints_;
}

int Report::finish(const checkpoint::TrainingState& state, verify::StepCheck& check_run) {
  // How often to checkpoint: Young's approximation.
  // J. W. Young, "A first order approximation to the optimum checkpoint interval" (CACM 1974): with a
  // checkpoint costing C seconds and a mean time between failures M, lose the least time by writing
  // one every sqrt(2 C M) seconds. Rank 0 measured C; every rank measured its step time.
  if (checkpoints_ > 0 && timed_steps_ > 0) {
    const double cost_s = write_ms_ / checkpoints_ / 1000.0, mtbf_s = o_.mtbf_hours * 3600.0;
    const double interval_s = std::sqrt(2.0 * cost_s * mtbf_s);
    const double per_step_s = step_ms_ / static_cast<double>(timed_steps_) / 1000.0;
    log("how often to checkpoint (Young 1974): sqrt(2 x checkpoint cost %.1f ms x MTBF %g h) = %.1f s, about every "
        "%.0f steps of %.2f ms\n", 1000 * cost_s, o_.mtbf_hours, interval_s, interval_s / per_step_s, 1000 * per_step_s);
    session_.metrics.write({{"event", "young"}, {"checkpoint_ms", 1000 * cost_s}, {"mtbf_hours", o_.mtbf_hours},
                           {"interval_s", interval_s}, {"step_ms", 1000 * per_step_s},
                           {"interval_steps", interval_s / per_step_s}});
  }


  // The result: checksums, and with --verify the uninterrupted run.
  const bool identical = trainer_.ddp->parameters_identical();
  const std::uint64_t checksum = parallel::parameter_checksum(trainer_.model->parameters());
  std::vector<Tensor> moments;
  for (const auto& [name, t] : trainer_.optimizer().state()) moments.push_back(t);
  const std::uint64_t optimizer_checksum = parallel::parameter_checksum(moments);
  log("final parameter checksum %016llx, optimizer state checksum %016llx (step %lld); ranks identical: %s\n",
      static_cast<unsigned long long>(checksum), static_cast<unsigned long long>(optimizer_checksum),
      static_cast<long long>(state.step), identical ? "yes" : "NO");
  const bool same_world = state.world_history.find(' ') == std::string::npos;
  double difference = 0, optimizer_difference = 0;
  verify::LockstepSummary check;
  bool passed = identical && !diverged_;
  if (check_run.checks() && diverged_) check = verify::finish_diverged(check_run, diverged_step_);
  if (check_run.checks() && !diverged_) {
    check = check_run.finish();
    if (check.passed)
      log("verify: steps %lld-%lld in lock-step against one rank (started from %s): every averaged gradient within its "
          "%s bound (%.3g of it), every update the optimizer's, bit for bit\n",
          static_cast<long long>(start_step_), static_cast<long long>(state.step) - 1,
          start_.resumed_from.empty() ? "the same initialisation" : "the checkpoint, restored on its own",
          dtype_name(o_.precision.reduce()),
          check.worst_gradient_ratio);
    else
      log("verify: lock-step FAILED at step %lld: %s\n", static_cast<long long>(check.first_failed_step),
          check.first_failure.c_str());
    passed = passed && check.passed;
    // And the run without interruption at this world size, in this job (the same seeds, the same data):
    // from the start where the world size never changed; after a change, from the checkpoint's state (what
    // the steps before it computed at the old world size rounds otherwise at this one), its steps taken
    // as one run never stopped would take them. Either way the same bits, parameters and moments.
    Trainer uninterrupted(o_, task_, group_);
    std::int64_t from = 0;
    if (!same_world) {
      MemoryCategoryOverride verification(MemoryCategory::verification);
      const auto& resume = dynamic_cast<const ResumeCheck&>(check_run);  // it restored the checkpoint
      checkpoint::restore(resume.resumed_path(), resume.resumed(), *uninterrupted.model, uninterrupted.optimizer());
      uninterrupted.recipe->load_scaler_state(start_.state.loss_scale);
      from = start_step_;
    }
    for (std::int64_t step = from; step < o_.training.steps; ++step) {
      uninterrupted.forward_backward(task_, stream_, step * global_batch_, global_batch_, group_);
      uninterrupted.update(step);
    }
    difference = verify::max_abs_diff(trainer_.model->parameters_to_host(), uninterrupted.model->parameters_to_host());
    optimizer_difference =
        verify::max_abs_diff(trainer_.optimizer_state_to_host(), uninterrupted.optimizer_state_to_host());
    const bool bit_identical = checksum == parallel::parameter_checksum(uninterrupted.model->parameters()) &&
                               difference == 0 && optimizer_difference == 0 &&
                               trainer_.optimizer().steps_taken() == uninterrupted.optimizer().steps_taken();
    if (same_world)
      log("verify: against the uninterrupted run at %d ranks: parameters and optimizer state %s (largest differences "
          "%.3g and %.3g)\n", group_.size(), bit_identical ? "bit-identical" : "DIFFER", difference, optimizer_difference);
    else
      log("verify: world sizes %s; against a run at %d ranks uninterrupted from the checkpoint of step %lld: "
          "parameters and optimizer state %s (largest differences %.3g and %.3g)\n",
          state.world_history.c_str(), group_.size(), static_cast<long long>(start_step_),
          bit_identical ? "bit-identical" : "DIFFER", difference, optimizer_difference);
    passed = passed && bit_identical;
  }
  if (!diverged_) cli::report_evaluation(task_, *trainer_.model, group_, session_.metrics);
  if (!o_.save.empty())
    parallel::on_rank0(group_, [&] {
      checkpoint::save_parameters(o_.save, *trainer_.model, {{"chapter", "06_checkpoint_failover"},
                                                           {"steps", std::to_string(state.step)}});
      log("parameters saved to %s\n", o_.save.c_str());
    });
  session_.metrics.write({{"event", "failover_summary"}, {"ranks", group_.size()}, {"steps", state.step},
                         {"start_step", start_step_}, {"resumed_from", start_.resumed_from}, {"rejected", start_.rejected},
                         {"restart_count", cli::KillOptions::restart_count()}, {"world_history", state.world_history},
                         {"checksum", checksum}, {"optimizer_checksum", optimizer_checksum},
                         {"identical", identical}, {"checkpoints", checkpoints_},
                         {"write_mb_per_s", write_ms_ > 0 ? written_mb_ / (write_ms_ / 1000.0) : 0.0},
                         {"verified", o_.verify}, {"same_world", same_world}, {"max_diff", difference},
                         {"optimizer_max_diff", optimizer_difference}, {"lockstep_passed", check.passed},
                         {"first_failed_step", check.first_failed_step}, {"gradient_bound_ratio", check.worst_gradient_ratio},
                         {"rounding_bias_ratio", check.worst_bias_ratio},
                         {"emulated_ratio", check.worst_emulated_ratio},
                         {"fault", o_.faults.fault}, {"fault_step", fault_step_}, {"diverged", diverged_}, {"passed", passed}});
  log("%s\n", passed ? "PASSED" : "FAILED");
  return passed ? 0 : 1;
}

}  // namespace course::chapter06
