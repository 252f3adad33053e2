// Chapter 04's timings, drift figure, metrics and verdict.
#include "04_ddp/report.h"

#include <algorithm>
#include <cmath>
#include <thread>
#include <utility>

#include "common/comm/agree.h"  // all_reduce_scalar
#include "common/checkpoint/parameters.h"
#include "common/cli/model_options.h"
#include "common/core/errors.h"
#include "common/core/log.h"
#include "common/core/memory.h"
#include "common/ops/autocast.h"
#include "common/parallel/replicas.h"
#include "common/verify/compare.h"

namespace course::chapter04 {
namespace {
using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }
}  // namespace

Report::Report(const Options& o, cli::Session& session, const nn::TrainingTask& task,
               const parallel::DistributedSampler& sampler, nn::Module& model, std::int64_t global_batch,
               std::int64_t total_steps, const optim::Recipe& training)
    : o_(o), session_(session), task_(task), sampler_(sampler), model_(model), group_(session.topology->dp_group()),
      global_batch_(global_batch), local_batch_(global_batch / group_.size()), total_steps_(total_steps),
      training_(training) {
  log("DDP: %d ranks x %lld samples (global batch %lld, %d micro-batches each), %s, %lld steps, lr %g, %s\n",
      group_.size(), static_cast<long long>(local_batch_), static_cast<long long>(global_batch_), o.accum,
      task.description.c_str(), static_cast<long long>(total_steps), o.training.lr, cli::precision_description(o.precision).c_str());
  if (all_ranks_log()) log("%s\n", session.topology->describe().c_str());
}

void Report::begin_step(std::int64_t step) {
  cli::fail_here_if_asked("train", step, group_.rank());  // the tests' failure on one rank (COURSE_FAIL)
  // The step's activations at their peak (forward and backward; --recompute's figure). The lock-step
  // reference's memory is counted apart (MemoryCategory::verification).
  activations_before_ = memory_stats(session_.device).current_of(MemoryCategory::activations);
  reset_peak_memory(session_.device);
  began_ = Clock::now();
}

bool Report::end_step(std::int64_t step, float loss, double communication_ms, double check_ms) {
  const double step_ms = ms_since(began_) - check_ms;
  peak_activations_ = std::max(peak_activations_, memory_stats(session_.device).peak_of(MemoryCategory::activations) -
                                                      activations_before_);
  if (step > 0 || total_steps_ == 1) {  // the first step warms up allocators and caches
    total_ms_ += step_ms;
    comm_ms_ += communication_ms;
    compute_ms_ += step_ms - communication_ms;
    timed_samples_ += global_batch_;
  }
  if (!std::isfinite(loss)) {
    log("step %4lld  loss %g: training diverged; lower the learning rate (--lr %g)\n", static_cast<long long>(step),
        loss, o_.training.lr);
    diverged_ = true;
    diverged_step_ = step;
    return false;
  }
  if (training_.skipped())
    log("step %4lld  skipped: the fp16 gradient overflowed; loss scale now %g\n", static_cast<long long>(step),
        training_.scaler().get_scale());
  if (step % o_.log_every == 0 || step + 1 == total_steps_) {
    log("step %4lld  loss %.6f  %.2f ms (compute %.2f, communication %.2f)\n", static_cast<long long>(step), loss,
        step_ms, step_ms - communication_ms, communication_ms);
    session_.metrics.write({{"event", "step"}, {"step", step}, {"loss", loss}, {"step_ms", step_ms},
                            {"compute_ms", step_ms - communication_ms}, {"comm_ms", communication_ms}});
  }
  return true;
}

// One rank, the same initial weights (rank 0's), the same global batches, free-running. With
// `reversed`, each batch's samples come in reverse order: the same sums, added in another order.
std::vector<float> Report::single_rank_run(bool reversed) const {
  auto model = task_.make_model(o_.common.seed);
  optim::Recipe training(model->parameters(), {.name = o_.optimizer, .lr = o_.training.lr, .total_steps = total_steps_,
                                                .precision = o_.precision.dtype()});
  for (std::int64_t step = 0; step < total_steps_; ++step) {
    auto batch = sampler_.global_batch(step, local_batch_);
    if (reversed) std::reverse(batch.begin(), batch.end());
    Tensor loss;
    {
      Autocast autocast(training.precision());
      loss = task_.loss(*model, batch);
    }
    training.scale_loss(loss).backward();
    training.step(step);
  }
  return model->parameters_to_host();
}

int Report::finish(bool identical, verify::StepCheck& check_run) {
  const int ranks = group_.size();
  const double timed_steps = static_cast<double>(std::max<std::int64_t>(1, total_steps_ - 1));
  const double samples_per_s = total_ms_ > 0 ? static_cast<double>(timed_samples_) / (total_ms_ / 1000.0) : 0.0;
  log("throughput: %.0f samples/s; per step %.2f ms = compute %.2f + communication %.2f; activations at their peak "
      "%.2f MiB per rank\n", samples_per_s, total_ms_ / timed_steps, compute_ms_ / timed_steps, comm_ms_ / timed_steps,
      static_cast<double>(peak_activations_) / (1024.0 * 1024.0));
  log("parameters identical on all %d ranks: %s\n", ranks, identical ? "yes" : "NO");
  verify::LockstepSummary check;
  verify::Drift drift;
  if (check_run.checks() && diverged_) check = verify::finish_diverged(check_run, diverged_step_);
  if (check_run.checks() && !diverged_) {
    check = check_run.finish();
    if (check.passed)
      log("lock-step check, %lld steps: every averaged gradient within its %s bound of the single-rank gradient "
          "(largest difference %.3g, %.3g of its bound; loss %.3g, %.3g of its bound), every update the "
          "single-rank optimizer's, bit for bit%s\n",
          static_cast<long long>(check.steps), dtype_name(o_.precision.reduce()), check.worst_gradient_diff, check.worst_gradient_ratio,
          check.worst_loss_diff, check.worst_loss_ratio,
          check.skipped_steps ? (" (" + std::to_string(check.skipped_steps) + " fp16 steps overflowed and were "
                                 "skipped by both)").c_str() : "");
    else
      log("lock-step check FAILED at step %lld: %s\n", static_cast<long long>(check.first_failed_step),
          check.first_failure.c_str());
  }
  if (o_.drift && !diverged_) {
    parallel::on_rank0(group_, [&] {
      auto reference = single_rank_run(false);
      auto reordered = single_rank_run(true);
      drift = {verify::max_abs_diff(model_.parameters_to_host(), reference), verify::max_abs_diff(reference, reordered)};
    });
    log("final parameters: largest difference from the single-rank run %.3g; its noise floor (the same run with "
        "each batch summed in reverse order) %.3g; ratio %.3g\n", drift.difference, drift.noise_floor, drift.ratio());
  }
  if (!diverged_) cli::report_evaluation(task_, model_, group_, session_.metrics);
  const bool passed = identical && check.passed && !diverged_;
  if (!o_.save.empty())
    parallel::on_rank0(group_, [&] {  // the ranks hold the same parameters: rank 0 writes them
      checkpoint::save_parameters(o_.save, model_, {{"chapter", "04_ddp"}, {"ranks", std::to_string(ranks)},
                                                    {"steps", std::to_string(total_steps_)}});
      log("parameters saved to %s\n", o_.save.c_str());
    });
  session_.metrics.write({{"event", "ddp_summary"}, {"ranks", ranks}, {"global_batch", global_batch_},
                          {"per_rank_batch", local_batch_}, {"accum", o_.accum}, {"steps", total_steps_},
                          {"samples_per_s", samples_per_s}, {"step_ms", total_ms_ / timed_steps},
                          {"compute_ms", compute_ms_ / timed_steps}, {"comm_ms", comm_ms_ / timed_steps},
                          {"parameters", model_.parameter_count()}, {"identical", identical}, {"verified", o_.verify},
                          {"lockstep_passed", check.passed}, {"first_failed_step", check.first_failed_step},
                          {"gradient_bound_ratio", check.worst_gradient_ratio}, {"loss_bound_ratio", check.worst_loss_ratio},
                          {"rounding_bias_ratio", check.worst_bias_ratio},
                          {"emulated_ratio", check.worst_emulated_ratio},
                          {"max_diff", drift.difference}, {"noise_floor", drift.noise_floor},
                          {"drift_ratio", drift.ratio()}, {"diverged", diverged_}, {"passed", passed},
                          {"precision", o_.precision.precision}, {"reduce_dtype", o_.precision.reduce_dtype},
                          {"recompute", o_.models.recompute}, {"peak_activation_bytes", peak_activations_},
                          {"skipped_steps", training_.scaler().skipped_steps()},
                          {"fault", o_.faults.fault}, {"fault_from_step", o_.faults.from_step},
                          {"backend", group_.backend_name()}, {"device", device_name(session_.device)},
                          {"model", o_.models.model}, {"local_size", group_.local_size()},
                          {"cores", std::thread::hardware_concurrency()}});
  log("%s\n", passed ? "PASSED" : "FAILED");
  return passed ? 0 : 1;
}

}  // namespace course::chapter04
