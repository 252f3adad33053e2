// Chapter 04: distributed data parallel. Every rank holds the whole MLP and trains on its own share of
// each global batch; DDP broadcasts the initial weights and averages the gradients, so all ranks take
// the same step. The program checks that the ranks end bit-identical and, with --verify, that at every
// step the averaged gradient equals the single-rank gradient of the global batch and the update is the
// one the single-rank optimizer makes from it (lock-step); with --drift also how far the final weights
// are from a free-running single-rank run, compared with that run's own rounding noise.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <thread>

#include "common/checkpoint/parameters.h"        // --save and --init: parameters as safetensors
#include "common/cli/cli.h"                      // common flags, validators, exit codes
#include "common/cli/limits.h"                   // refuse what cannot fit in memory
#include "common/cli/model_options.h"            // --model mlp|gpt and the GPT's flags
#include "common/cli/session.h"                  // device, topology and metrics, set up once
#include "common/comm/environment.h"             // MPI start-up
#include "common/core/log.h"                     // rank 0 prints
#include "common/nn/tasks.h"                     // --model mlp|gpt: the model, its data and its loss
#include "common/ops/ops.h"                      // mse_loss, scale
#include "common/optim/recipe.h"                 // --optimizer: SGD, or AdamW with warm-up, cosine decay, clipping
#include "common/parallel/ddp.h"                 // DistributedDataParallel
#include "common/parallel/distributed_sampler.h" // each rank's share of the data
#include "common/parallel/replicas.h"            // on_rank0
#include "common/verify/compare.h"               // max_abs_diff, the noise floor
#include "common/verify/lockstep.h"              // the step-by-step check against one rank

using namespace course;
using Clock = std::chrono::steady_clock;

namespace {

struct Options {
  cli::CommonOptions common;
  cli::DistributedOptions distributed;
  std::int64_t global_batch = 240;  // divisible by 1, 2, 3, 4, 5, 6 and 8 ranks
  int accum = 1;
  std::int64_t steps = 60;
  std::int64_t epochs = 0;
  float lr = 0.01f;
  std::int64_t samples = 8192;
  std::int64_t features = 16;
  std::int64_t hidden = 256;
  int layers = 2;
  int log_every = 10;
  bool verify = false, drift = false;
  cli::FaultOptions faults;  // --fault, --fault-from-step
  std::string save;
  std::string init;  // start from these parameters (--save of any chapter, or 07's consolidated checkpoint)
  cli::ModelOptions models;  // --model mlp|gpt, the GPT's sizes, --data
  bool samples_given = false;
  std::string optimizer = "sgd";  // optim::Recipe: sgd, or adamw for the GPT
};

// The most steps a run may take: a bound that keeps every step count exact in the metrics and
// turns a mistyped --epochs into an error instead of a run that never ends.
constexpr std::int64_t kMaxSteps = 10'000'000;

nn::TrainingTask make_task(const Options& o, Device device) {
  if (!o.models.data.empty() && o.models.model != "gpt") throw UsageError("--data: a text file is for --model gpt");
  nn::TrainingTask task = o.models.model == "mlp"
                              ? nn::mlp_task(o.samples, o.features, o.hidden, o.layers, device, o.common.seed)
                              : cli::gpt_training_task(o.models, o.samples, o.samples_given, device, o.common.seed);
  if (!o.init.empty()) {  // every model the run makes (the reference's too) starts from the file
    task.make_model = [fresh = task.make_model, path = o.init](std::uint64_t seed) {
      auto model = fresh(seed);
      try {
        checkpoint::load_parameters(path, *model);
      } catch (const checkpoint::CheckpointError& e) {
        throw UsageError(std::string("--init: ") + e.what());
      }
      return model;
    };
    task.make_model(0);  // a file that does not fit fails now, on every rank alike
  }
  return task;
}

// Forward and backward on one rank's share, in `accum` micro-batches, each loss weighted by its share
// of the step (chapter 02). `backward(loss, last)` runs each micro-batch's backward: under DDP the
// first accum-1 skip the all-reduce (no_sync) and the last one synchronises the accumulated sum.
// Returns the share's loss.
template <class Backward>
float accumulate(nn::Module& model, const nn::TrainingTask& task, const std::vector<std::int64_t>& share, int accum,
                 Backward backward) {
  const auto micro = static_cast<std::int64_t>((share.size() + static_cast<std::size_t>(accum) - 1) / static_cast<std::size_t>(accum));
  auto micro_batches = data::split_batches(share, micro);
  double loss_sum = 0;
  for (std::size_t i = 0; i < micro_batches.size(); ++i) {
    float weight = static_cast<float>(micro_batches[i].size()) / static_cast<float>(share.size());
    Tensor loss = scale(task.loss(model, micro_batches[i]), weight);
    backward(loss, i + 1 == micro_batches.size());
    loss_sum += loss.item();
  }
  return static_cast<float>(loss_sum);
}

float forward_backward(parallel::DistributedDataParallel& ddp, const nn::TrainingTask& task,
                       const std::vector<std::int64_t>& share, int accum) {
  return accumulate(ddp.module(), task, share, accum, [&](Tensor& loss, bool last) {
    if (last) {
      loss.backward();  // the last micro-batch: gradients are averaged across ranks here
    } else {
      auto guard = ddp.no_sync();
      loss.backward();
    }
  });
}

// --fault: a deliberately wrong average from step --fault-from-step on, to watch --verify catch it (and
// to test that it can). `step` is the step being taken.
void install_fault(parallel::DistributedDataParallel& ddp, const cli::FaultOptions& faults, const std::int64_t& step) {
  if (faults.fault == "none") return;
  ddp.register_comm_hook([&faults, &step](comm::Communicator& group, Tensor& g) {
    if (faults.at("average-twice", step)) {
      group.all_reduce(g, comm::ReduceOp::average);
      g.copy_from(scale(g, 1.0f / static_cast<float>(group.size())));  // divided by the world size twice
      return comm::completed_work();
    }
    if (faults.at("skip-rank-share", step) && group.rank() == group.size() - 1) g.fill_(0.0f);  // never arrives
    return group.all_reduce_async(g, comm::ReduceOp::average);
  });
}

// One rank, the same initial weights (rank 0's), the same global batches, free-running. With
// `reversed`, each batch's samples come in reverse order: the same sums, added in another order.
std::vector<float> single_rank_run(const Options& o, const nn::TrainingTask& task, const parallel::DistributedSampler& sampler,
                                   std::int64_t local_batch, std::int64_t total_steps, bool reversed) {
  auto model = task.make_model(o.common.seed);
  optim::Recipe training(o.optimizer, model->parameters(), o.lr, total_steps);
  for (std::int64_t step = 0; step < total_steps; ++step) {
    auto batch = sampler.global_batch(step, local_batch);
    if (reversed) std::reverse(batch.begin(), batch.end());
    task.loss(*model, batch).backward();
    training.step(step);
  }
  return model->parameters_to_host();
}

int run(const Options& o, cli::Session& session) {
  parallel::Topology& topology = *session.topology;
  comm::Communicator& group = topology.dp_group();  // pure data parallelism: every rank
  const Device device = session.device;
  const int ranks = group.size();
  // The verification's reference holds a second model and the whole global batch.
  if (o.models.model == "mlp")
    cli::check_memory((o.verify ? 2 : 1) * cli::mlp_training_bytes(o.samples, o.features, o.hidden, o.layers, o.global_batch),
                      "--samples " + std::to_string(o.samples) + ", --hidden " + std::to_string(o.hidden) +
                          ", --layers and --global-batch",
                      group.local_size());
  const nn::TrainingTask task = make_task(o, device);  // the same data on every rank
  if (o.global_batch > task.size)
    throw UsageError("--global-batch: " + std::to_string(o.global_batch) + " is more than the " +
                     std::to_string(task.size) + " samples of the dataset (--samples)");
  if (o.global_batch % (static_cast<std::int64_t>(ranks) * o.accum) != 0)
    throw UsageError("--global-batch: " + std::to_string(o.global_batch) + " is not divisible by ranks x --accum (" +
                     std::to_string(ranks) + " x " + std::to_string(o.accum) + ")");
  // Each rank initialises with its own seed on purpose: the broadcast in DDP's constructor is what
  // makes them start identical.
  auto model = task.make_model(o.common.seed + static_cast<std::uint64_t>(topology.rank()));
  // This chapter's lesson: one all-reduce per gradient, after backward (chapter 05 adds buckets and overlap).
  parallel::ReducerOptions one_by_one;
  one_by_one.per_parameter = true;
  parallel::DistributedDataParallel ddp(model, group, one_by_one);
  std::int64_t step = 0;
  install_fault(ddp, o.faults, step);
  parallel::DistributedSampler sampler(task.size, group, o.common.seed);

  const std::int64_t local_batch = o.global_batch / ranks;
  const std::int64_t steps_per_epoch = sampler.steps_per_epoch(local_batch);
  if (o.epochs > kMaxSteps / steps_per_epoch)
    throw UsageError("--epochs: " + std::to_string(o.epochs) + " epochs of " + std::to_string(steps_per_epoch) +
                     " steps exceed " + std::to_string(kMaxSteps) + " steps");
  const std::int64_t total_steps = o.epochs > 0 ? o.epochs * steps_per_epoch : o.steps;
  cli::check_fault_options(o.faults, total_steps);
  optim::Recipe training(o.optimizer, model->parameters(), o.lr, total_steps);
  log("DDP: %d ranks x %lld samples (global batch %lld, %d micro-batches each), %s, %lld steps, lr %g\n", ranks,
      static_cast<long long>(local_batch), static_cast<long long>(o.global_batch), o.accum, task.description.c_str(),
      static_cast<long long>(total_steps), o.lr);
  if (all_ranks_log()) log("%s\n", topology.describe().c_str());

  // --verify: a single-rank reference beside the run, re-synced to the run's parameters every step, with
  // the run's own optimizer to repeat its updates.
  std::unique_ptr<optim::Recipe> reference_training;
  std::unique_ptr<verify::Lockstep> lockstep;
  if (o.verify) {
    auto reference = verify::make_reference([&] { return task.make_model(o.common.seed); });
    reference_training = std::make_unique<optim::Recipe>(o.optimizer, reference->parameters(), o.lr, total_steps);
    lockstep = std::make_unique<verify::Lockstep>(
        reference, [&](std::int64_t s) { reference_training->update(s); }, &group, reference_training->clip());
  }

  double total_ms = 0, compute_ms = 0, comm_ms = 0;
  std::int64_t timed_samples = 0;
  bool diverged = false;
  for (step = 0; step < total_steps; ++step) {
    auto share = sampler.batch(step, local_batch);
    cli::fail_here_if_asked("train", step, topology.rank());
    if (lockstep) lockstep->begin_step(step, *model);

    ddp.take_communication_ms();
    auto begin = Clock::now();
    float local_loss = forward_backward(ddp, task, share, o.accum);
    double step_ms = std::chrono::duration<double, std::milli>(Clock::now() - begin).count();
    double step_comm = ddp.take_communication_ms();

    Tensor loss = Tensor::from_host({local_loss}, {1});  // the global batch's loss: the ranks' mean
    group.all_reduce(loss, comm::ReduceOp::average);
    const float global_loss = loss.item();
    if (lockstep) {
      // The reference: each rank's share of the global batch (positions r, r+R, ...) recomputed from the
      // global batch as that rank computed it, and averaged exactly.
      const auto global = sampler.global_batch(step, local_batch);
      lockstep->check_parts(step, *model, global_loss, static_cast<std::size_t>(ranks), 1.0 / ranks,
                            [&](nn::Module& reference, std::size_t r) {
                              const auto theirs = parallel::DistributedSampler::share_of(global, static_cast<int>(r), ranks);
                              return accumulate(reference, task, theirs, o.accum, [](Tensor& loss, bool) { loss.backward(); });
                            });
    }
    begin = Clock::now();
    const double norm = training.step(step);
    step_ms += std::chrono::duration<double, std::milli>(Clock::now() - begin).count();
    if (lockstep) lockstep->check_update(step, norm);

    if (step > 0 || total_steps == 1) {  // the first step warms up allocators and caches
      total_ms += step_ms;
      comm_ms += step_comm;
      compute_ms += step_ms - step_comm;
      timed_samples += static_cast<std::int64_t>(share.size()) * ranks;
    }
    if (!std::isfinite(global_loss)) {
      log("step %4lld  loss %g: training diverged; lower the learning rate (--lr %g)\n", static_cast<long long>(step),
          global_loss, o.lr);
      diverged = true;
      break;
    }
    if (step % o.log_every == 0 || step + 1 == total_steps) {
      log("step %4lld  loss %.6f  %.2f ms (compute %.2f, communication %.2f)\n", static_cast<long long>(step),
          global_loss, step_ms, step_ms - step_comm, step_comm);
      session.metrics.write({{"event", "step"}, {"step", step}, {"loss", global_loss}, {"step_ms", step_ms},
                             {"compute_ms", step_ms - step_comm}, {"comm_ms", step_comm}});
    }
  }
  const double timed_steps = static_cast<double>(std::max<std::int64_t>(1, total_steps - 1));
  const double samples_per_s = total_ms > 0 ? static_cast<double>(timed_samples) / (total_ms / 1000.0) : 0.0;
  log("throughput: %.0f samples/s; per step %.2f ms = compute %.2f + communication %.2f\n", samples_per_s,
      total_ms / timed_steps, compute_ms / timed_steps, comm_ms / timed_steps);

  const bool identical = ddp.parameters_identical();
  log("parameters identical on all %d ranks: %s\n", ranks, identical ? "yes" : "NO");
  verify::LockstepSummary check;
  verify::Drift drift;
  if (lockstep && !diverged) {
    check = lockstep->finish(*model);
    if (check.passed)
      log("lock-step check, %lld steps: every averaged gradient within its float32 bound of the single-rank gradient "
          "(largest difference %.3g, %.3g of its bound; loss %.3g, %.3g of its bound), every update the "
          "single-rank optimizer's, bit for bit\n",
          static_cast<long long>(check.steps), check.worst_gradient_diff, check.worst_gradient_ratio,
          check.worst_loss_diff, check.worst_loss_ratio);
    else
      log("lock-step check FAILED at step %lld: %s\n", static_cast<long long>(check.first_failed_step),
          check.first_failure.c_str());
  }
  if (o.drift && !diverged) {
    parallel::on_rank0(group, [&] {
      auto reference = single_rank_run(o, task, sampler, local_batch, total_steps, false);
      auto reordered = single_rank_run(o, task, sampler, local_batch, total_steps, true);
      drift = {verify::max_abs_diff(model->parameters_to_host(), reference), verify::max_abs_diff(reference, reordered)};
    });
    log("final parameters: largest difference from the single-rank run %.3g; its noise floor (the same run with "
        "each batch summed in reverse order) %.3g; ratio %.3g\n", drift.difference, drift.noise_floor, drift.ratio());
  }
  if (!diverged) cli::report_evaluation(task, *model, group, session.metrics);
  const bool passed = identical && check.passed && !diverged;
  if (!o.save.empty())
    parallel::on_rank0(group, [&] {  // the ranks hold the same parameters: rank 0 writes them
      checkpoint::save_parameters(o.save, *model, {{"chapter", "04_ddp"}, {"ranks", std::to_string(ranks)},
                                                   {"steps", std::to_string(total_steps)}});
      log("parameters saved to %s\n", o.save.c_str());
    });
  session.metrics.write({{"event", "ddp_summary"}, {"ranks", ranks}, {"global_batch", o.global_batch},
                         {"per_rank_batch", local_batch}, {"accum", o.accum}, {"steps", total_steps},
                         {"samples_per_s", samples_per_s}, {"step_ms", total_ms / timed_steps},
                         {"compute_ms", compute_ms / timed_steps}, {"comm_ms", comm_ms / timed_steps},
                         {"parameters", model->parameter_count()}, {"identical", identical}, {"verified", o.verify},
                         {"lockstep_passed", check.passed}, {"first_failed_step", check.first_failed_step},
                         {"gradient_bound_ratio", check.worst_gradient_ratio}, {"loss_bound_ratio", check.worst_loss_ratio},
                         {"max_diff", drift.difference}, {"noise_floor", drift.noise_floor},
                         {"drift_ratio", drift.ratio()}, {"diverged", diverged}, {"passed", passed},
                         {"fault", o.faults.fault}, {"fault_from_step", o.faults.from_step},
                         {"backend", group.backend_name()}, {"device", device_name(device)}, {"model", o.models.model},
                         {"local_size", group.local_size()}, {"cores", std::thread::hardware_concurrency()}});
  log("%s\n", passed ? "PASSED" : "FAILED");
  return passed ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  comm::Environment env(argc, argv);
  CLI::App app{"Chapter 04: distributed data parallel training, checked against the single-rank run"};
  Options o;
  cli::add_common_options(app, o.common);
  cli::add_distributed_options(app, o.distributed);
  cli::add_save_option(app, o.save);
  app.add_option("--init", o.init, "Start from the parameters in this safetensors file (names and shapes must match "
                                   "the model)")->check(CLI::ExistingFile);
  app.add_option("--global-batch", o.global_batch, "Samples per optimizer step, over all ranks")
      ->check(cli::PositiveInteger & CLI::Range(std::int64_t{1}, std::int64_t{1} << 24))->capture_default_str();
  app.add_option("--accum", o.accum, "Micro-batches per step on each rank (gradient accumulation)")
      ->check(cli::PositiveInteger)->capture_default_str();
  auto* steps = app.add_option("--steps", o.steps, "Optimizer steps")
      ->check(cli::PositiveInteger & CLI::Range(std::int64_t{1}, kMaxSteps))->capture_default_str();
  app.add_option("--epochs", o.epochs, "Train whole epochs instead of --steps")
      ->check(cli::PositiveInteger & CLI::Range(std::int64_t{1}, kMaxSteps))->excludes(steps);
  app.add_option("--lr", o.lr, "SGD learning rate (scale it with the global batch, see README)")
      ->check(cli::PositiveFinite)->capture_default_str();
  app.add_option("--samples", o.samples, "Dataset size")
      ->check(cli::PositiveInteger & CLI::Range(std::int64_t{1}, std::int64_t{1} << 24))->capture_default_str();
  app.add_option("--features", o.features, "Input features")->check(CLI::Range(2, 1 << 16))->capture_default_str();
  app.add_option("--hidden", o.hidden, "Hidden width")->check(CLI::Range(1, 1 << 14))->capture_default_str();
  app.add_option("--layers", o.layers, "Hidden layers (MLP)")->check(CLI::Range(1, 64))->capture_default_str();
  cli::add_model_options(app, o.models);
  app.add_option("--optimizer", o.optimizer, "sgd, or adamw with warm-up, cosine decay and clipping (for the GPT)")
      ->check(CLI::IsMember({"sgd", "adamw"}))->capture_default_str();
  app.add_option("--log-every", o.log_every, "Print the loss every N steps")->check(cli::PositiveInteger)->capture_default_str();
  app.add_flag("--verify", o.verify, "Check every step against one rank with the global batch (lock-step): the "
                                     "averaged gradient, the loss and the update");
  app.add_flag("--drift", o.drift, "Also train one rank free-running, twice (the second summing each batch in reverse), "
                                   "and report how far the final parameters drift against that noise floor");
  cli::add_fault_options(app, o.faults, {{"average-twice", "the average divided by the world size twice"},
                                         {"skip-rank-share", "the last rank's share of the gradient never arrives"}});
  return cli::run(app, argc, argv, [&] {
    o.samples_given = app.count("--samples") > 0;
    cli::Session session = cli::start_session(o.common, o.distributed);
    return run(o, session);
  });
}
