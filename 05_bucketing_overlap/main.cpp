// Chapter 05: gradient buckets and overlap. The same deep MLP, data and steps in four ways of
// synchronising gradients: one all-reduce per gradient after backward (chapter 04), one flat
// all-reduce after backward, buckets after backward, and buckets launched while backward is still
// running. Each mode prints its step time split into compute and exposed communication, and is
// checked in lock-step against one rank. A timeline of one step is written as Chrome trace JSON.
#include <algorithm>
#include <chrono>
#include <cmath>

#include "common/checkpoint/parameters.h"         // --save: the final parameters as safetensors
#include "common/cli/cli.h"                       // common flags, validators, exit codes
#include "common/cli/limits.h"                    // refuse what cannot fit in memory
#include "common/cli/model_options.h"             // --model mlp|gpt and the GPT's flags
#include "common/cli/session.h"                   // device, topology and metrics, set up once
#include "common/comm/environment.h"              // MPI start-up
#include "common/comm/simulated_network.h"        // --sim-network: an alpha-beta delay per message
#include "common/core/log.h"                      // rank 0 prints
#include "common/metrics/trace.h"                 // the timeline as Chrome trace JSON
#include "common/nn/tasks.h"                      // the MLP or the GPT, and its loss
#include "common/ops/ops.h"                       // mse_loss
#include "common/optim/optimizer.h"               // SGD
#include "common/parallel/comm_hooks.h"           // --comm-hook: fp16 and bf16 compression
#include "common/parallel/ddp.h"                  // DistributedDataParallel over the Reducer's buckets
#include "common/parallel/distributed_sampler.h"  // each rank's share of the data
#include "common/parallel/replicas.h"             // on_rank0
#include "common/verify/compare.h"                // max_abs_diff
#include "common/verify/lockstep.h"               // the step-by-step check against one rank

using namespace course;
using Clock = std::chrono::steady_clock;

namespace {

struct Options {
  cli::CommonOptions common;
  cli::DistributedOptions distributed;
  int depth = 8;
  std::int64_t width = 1024, features = 64, samples = 4096, global_batch = 128;
  int steps = 8;
  float lr = 0.001f;
  double bucket_mb = 25, first_bucket_mb = 1;
  std::string sim_network, trace, comm_hook = "none";  // no trace unless asked: nothing lands in the current folder
  std::string save;
  cli::ModelOptions models;  // --model mlp|gpt, the GPT's sizes, --data
  bool samples_given = false;
  bool sweep_buckets = false, verify = true;  // the lesson is only worth its speed-up if every mode is right
  cli::FaultOptions faults;  // --fault, --fault-from-step
};

struct Mode {
  std::string name;
  parallel::ReducerOptions options;
};

std::vector<Mode> modes(const Options& o) {
  parallel::ReducerOptions per_parameter, flat, buckets, overlap;
  per_parameter.per_parameter = true;
  per_parameter.overlap = false;
  flat.bucket_cap_mb = flat.first_bucket_mb = 1e9;  // one bucket holds everything
  flat.overlap = false;
  buckets.bucket_cap_mb = overlap.bucket_cap_mb = o.bucket_mb;
  buckets.first_bucket_mb = overlap.first_bucket_mb = o.first_bucket_mb;
  buckets.overlap = false;
  overlap.record_timeline = true;
  return {{"per-parameter", per_parameter}, {"flat", flat}, {"buckets", buckets}, {"buckets+overlap", overlap}};
}

struct ModeResult {
  double step_ms = 0, exposed_ms = 0;  // per step, mean over the timed steps
  std::size_t buckets = 0;
  std::int64_t bytes_per_step = 0;
  std::vector<float> parameters;
  std::shared_ptr<nn::Module> model;  // the trained model (--save writes the overlapped mode's)
  verify::LockstepSummary check;
  parallel::Timeline timeline;  // the last step (overlap mode)
};

// --fault: a bucket handled wrongly from --fault-from-step on, as a bug in a reducer would handle it,
// around the chosen hook `inner`. `launched` counts the buckets launched in this step's backward:
// buckets launch in bucket order, so it is the bucket's index.
parallel::CommHook with_fault(const cli::FaultOptions& faults, parallel::CommHook inner, parallel::Reducer& reducer,
                              const std::int64_t& step, std::size_t& launched) {
  if (faults.fault == "none") return inner;
  return [&faults, inner, &reducer, &step, &launched](comm::Communicator& group, Tensor& buffer) {
    const std::size_t b = launched++, buckets = reducer.buckets().size();
    if (faults.at("skip-bucket", step) && b == 0) return comm::completed_work();  // never all-reduced
    if (faults.at("launch-early", step) && b == 0) {
      // Launched before its last gradient was in: the all-reduce averages the rest, and that gradient
      // lands afterwards, this rank's own.
      const std::size_t late = reducer.buckets()[0].offsets.back(), n = static_cast<std::size_t>(buffer.numel()) - late;
      Tensor own = buffer.flat_view(late, n).clone();
      inner(group, buffer)->wait();
      buffer.flat_view(late, n).copy_from(own);
      return comm::completed_work();
    }
    if (faults.at("step-early", step) && b + 1 == buckets) {
      // The optimizer steps before the last bucket's average lands: it reads this rank's own gradients.
      Tensor copy = buffer.clone();
      inner(group, copy)->wait();
      return comm::completed_work();
    }
    return inner(group, buffer);
  };
}

ModeResult train(const Options& o, const Mode& mode, comm::Communicator& group, const nn::TrainingTask& task,
                 int steps) {
  const int ranks = group.size();
  auto model = task.make_model(o.common.seed + static_cast<std::uint64_t>(group.rank()));
  parallel::DistributedDataParallel ddp(model, group, mode.options);
  std::int64_t step = 0;
  std::size_t launched = 0;
  ddp.register_comm_hook(with_fault(o.faults, parallel::comm_hook_named(o.comm_hook), ddp.reducer(), step, launched));
  optim::SGD sgd(model->parameters(), o.lr);
  parallel::DistributedSampler sampler(task.size, group, o.common.seed);
  const std::int64_t local = o.global_batch / ranks;
  // --verify: one rank's model and SGD beside the run, re-synced to it every step (chapter 04).
  std::unique_ptr<optim::SGD> reference_sgd;
  std::unique_ptr<verify::Lockstep> lockstep;
  if (o.verify) {
    auto reference = verify::make_reference([&] { return task.make_model(o.common.seed); });
    reference_sgd = std::make_unique<optim::SGD>(reference->parameters(), o.lr);
    lockstep = std::make_unique<verify::Lockstep>(reference, [&](std::int64_t) {
      reference_sgd->step();
      reference_sgd->zero_grad();
    }, &group);
    // A 16-bit hook adds in 16 bits: the bound follows its unit roundoff (common/verify/compare.h).
    if (o.comm_hook == "fp16") lockstep->set_rounding(verify::kFloat16Rounding);
    if (o.comm_hook == "bf16") lockstep->set_rounding(verify::kBfloat16Rounding);
  }
  ModeResult result;
  std::int64_t bytes_before = 0;
  for (step = 0; step < steps; ++step) {
    if (lockstep) lockstep->begin_step(step, *model);
    launched = 0;
    const auto share = sampler.batch(step, local);
    if (step == 1) bytes_before = ddp.reducer().bytes_communicated();
    group.barrier();  // every rank starts the step together, so the times compare
    const auto begin = Clock::now();
    Tensor loss = task.loss(ddp.module(), share);
    loss.backward();  // the buckets' all-reduces run inside, overlapped or after it
    const double step_ms = std::chrono::duration<double, std::milli>(Clock::now() - begin).count();
    if (step > 0) {  // the first step allocates and rebuilds the buckets
      result.step_ms += step_ms / (steps - 1);
      result.exposed_ms += ddp.reducer().exposed_ms() / (steps - 1);
    }
    if (lockstep) {
      Tensor global_loss = Tensor::from_host({loss.item()}, {1});
      group.all_reduce(global_loss, comm::ReduceOp::average);
      const auto global = sampler.global_batch(step, local);
      lockstep->check_parts(step, *model, global_loss.item(), static_cast<std::size_t>(ranks), 1.0 / ranks,
                            [&](nn::Module& reference, std::size_t r) {
                              const auto theirs = parallel::DistributedSampler::share_of(global, static_cast<int>(r), ranks);
                              Tensor l = task.loss(reference, theirs);
                              l.backward();
                              return l.item();
                            });
    }
    sgd.step();
    sgd.zero_grad();
    if (lockstep) lockstep->check_update(step);
  }
  result.buckets = ddp.reducer().buckets().size();
  result.bytes_per_step = (ddp.reducer().bytes_communicated() - bytes_before) / std::max(1, steps - 1);
  result.timeline = ddp.reducer().last_timeline();
  result.parameters = model->parameters_to_host();
  result.model = model;
  if (lockstep) result.check = lockstep->finish(*model);
  return result;
}

// Every rank's timeline of the last overlapped step, gathered to rank 0 as numbers.
void write_trace(const Options& o, comm::Communicator& group, const parallel::Timeline& mine,
                 const std::string& label) {
  std::vector<float> packed;
  for (const auto& i : mine.compute)
    packed.insert(packed.end(), {static_cast<float>(i.begin_ms), static_cast<float>(i.end_ms)});
  for (const auto& i : mine.communication)
    packed.insert(packed.end(), {static_cast<float>(i.begin_ms), static_cast<float>(i.end_ms)});
  Tensor local = Tensor::from_host(packed, {static_cast<std::int64_t>(packed.size())});
  Tensor all = Tensor::zeros({static_cast<std::int64_t>(packed.size()) * group.size()});
  group.all_gather(local, all);  // every rank's timeline has the same shape: the same layers and buckets
  if (group.rank() != 0 || o.trace.empty()) return;
  auto values = all.to_host();
  metrics::ChromeTrace trace;
  trace.label(label);
  for (int r = 0; r < group.size(); ++r) {
    std::size_t at = static_cast<std::size_t>(r) * packed.size();
    for (const auto& i : mine.compute) {
      trace.add(r, "backward compute", "layer " + i.name, values[at], values[at + 1]);
      at += 2;
    }
    for (const auto& i : mine.communication) {
      trace.add(r, label.empty() ? "all-reduce" : "all-reduce (simulated)", i.name, values[at], values[at + 1]);
      at += 2;
    }
  }
  trace.write(o.trace);
  log("timeline of the last overlapped step written to %s (open it in ui.perfetto.dev)\n", o.trace.c_str());
}

int run(const Options& o, cli::Session& session) {
  parallel::Topology& topology = *session.topology;
  comm::Communicator& world = topology.dp_group();
  const int ranks = world.size();
  if (o.global_batch % ranks != 0)
    throw UsageError("--global-batch: " + std::to_string(o.global_batch) + " is not divisible by " +
                     std::to_string(ranks) + " ranks");
  if (!o.models.data.empty() && o.models.model != "gpt") throw UsageError("--data: a text file is for --model gpt");
  if (o.models.model == "mlp")
    cli::check_memory(
        (o.verify ? 2 : 1) * cli::mlp_training_bytes(o.samples, o.features, o.width, o.depth, o.global_batch),
        "--samples, --width " + std::to_string(o.width) + " and --depth " + std::to_string(o.depth), world.local_size());
  const nn::TrainingTask task =
      o.models.model == "mlp"
          ? nn::mlp_task(o.samples, o.features, o.width, o.depth, session.device, o.common.seed)
          : cli::gpt_training_task(o.models, o.samples, o.samples_given, session.device, o.common.seed);
  if (o.global_batch > task.size)
    throw UsageError("--global-batch: " + std::to_string(o.global_batch) + " is more than the " +
                     std::to_string(task.size) + " samples (--samples)");
  std::unique_ptr<comm::Communicator> simulated;
  std::string label;
  if (!o.sim_network.empty()) {
    auto model = comm::parse_network(o.sim_network);
    simulated = comm::simulate_network(world.split(0, world.rank()), model);
    label = " (simulated network: " + comm::describe(model) + ")";
  }
  comm::Communicator& group = simulated ? *simulated : world;
  log("Chapter 05: %d ranks, %s, global batch %lld, %d steps, comm hook %s%s\n", ranks, task.description.c_str(),
      static_cast<long long>(o.global_batch), o.steps, o.comm_hook.c_str(), label.c_str());
  log("%-16s %8s %10s %10s %10s %12s  %s\n", "mode", "buckets", "step(ms)", "compute", "exposed", "MB/step", "check");

  bool passed = true;
  std::vector<float> reference;
  ModeResult no_overlap, overlapped;
  for (const Mode& mode : modes(o)) {
    ModeResult r = train(o, mode, group, task, o.steps);
    const double diff = reference.empty() ? 0.0 : verify::max_abs_diff(r.parameters, reference);
    if (reference.empty()) reference = r.parameters;
    const bool ok = r.check.passed;
    passed = passed && ok;
    std::string check = !o.verify ? "(not verified)"
                        : ok      ? "PASSED"
                                  : "FAILED at step " + std::to_string(r.check.first_failed_step);
    // Free-running final weights differ from the per-parameter mode's only by summation order.
    char differs[64] = "";
    if (diff > 0) std::snprintf(differs, sizeof differs, "; final weights %.2g from per-parameter's", diff);
    log("%-16s %8zu %10.2f %10.2f %10.2f %12.2f  %s%s\n", mode.name.c_str(), r.buckets, r.step_ms,
        r.step_ms - r.exposed_ms, r.exposed_ms, static_cast<double>(r.bytes_per_step) / 1e6, check.c_str(), differs);
    if (o.verify && !ok) log("  %s\n", r.check.first_failure.c_str());
    session.metrics.write({{"event", "mode"},
                           {"mode", mode.name},
                           {"buckets", r.buckets},
                           {"step_ms", r.step_ms},
                           {"compute_ms", r.step_ms - r.exposed_ms},
                           {"exposed_ms", r.exposed_ms},
                           {"bytes_per_step", r.bytes_per_step},
                           {"verified", o.verify},
                           {"passed", ok},
                           {"gradient_bound_ratio", r.check.worst_gradient_ratio},
                           {"first_failed_step", r.check.first_failed_step},
                           {"diff_vs_per_parameter", diff},
                           {"ranks", ranks},
                           {"simulated_network", label},
                           {"comm_hook", o.comm_hook}});
    if (mode.name == "buckets") no_overlap = r;
    if (mode.name == "buckets+overlap") overlapped = r;
  }
  const double hidden = no_overlap.exposed_ms > 0 ? overlapped.exposed_ms / no_overlap.exposed_ms : 0.0;
  log("overlap leaves %.2f of the bucketed communication exposed (%.2f ms of %.2f ms)%s\n", hidden,
      overlapped.exposed_ms, no_overlap.exposed_ms, label.c_str());
  write_trace(o, group, overlapped.timeline, label);

  if (o.sweep_buckets) {
    log("\nstep time against the bucket cap (buckets+overlap)%s:\n%10s %8s %10s %10s\n", label.c_str(), "cap(MB)",
        "buckets", "step(ms)", "exposed");
    for (double cap : {0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 25.0, 50.0, 100.0}) {
      Mode m{"sweep", {}};
      m.options.bucket_cap_mb = cap;
      m.options.first_bucket_mb = std::min(cap, o.first_bucket_mb);
      Options quick = o;
      quick.verify = false;
      ModeResult r = train(quick, m, group, task, std::min(o.steps, 5));
      log("%10.2f %8zu %10.2f %10.2f\n", cap, r.buckets, r.step_ms, r.exposed_ms);
      session.metrics.write({{"event", "bucket_sweep"},
                             {"bucket_mb", cap},
                             {"buckets", r.buckets},
                             {"step_ms", r.step_ms},
                             {"exposed_ms", r.exposed_ms},
                             {"simulated_network", label}});
    }
  }
  if (!o.save.empty())
    parallel::on_rank0(group, [&] {  // the ranks hold the same parameters: rank 0 writes them
      checkpoint::save_parameters(o.save, *overlapped.model, {{"chapter", "05_bucketing_overlap"},
                                                              {"mode", "buckets+overlap"},
                                                              {"steps", std::to_string(o.steps)}});
      log("parameters (buckets+overlap) saved to %s\n", o.save.c_str());
    });
  session.metrics.write({{"event", "overlap_summary"},
                         {"exposed_fraction", hidden},
                         {"passed", passed},
                         {"verified", o.verify},
                         {"ranks", ranks},
                         {"simulated_network", label}});
  log("%s\n", passed ? "PASSED" : "FAILED");
  return passed ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  comm::Environment env(argc, argv);
  CLI::App app{"Chapter 05: gradient buckets and overlap of communication with backward"};
  Options o;
  cli::add_common_options(app, o.common);
  cli::add_distributed_options(app, o.distributed);
  cli::add_save_option(app, o.save);
  cli::add_model_options(app, o.models);
  app.add_option("--depth", o.depth, "Hidden layers of the MLP")->check(CLI::Range(1, 64))->capture_default_str();
  app.add_option("--width", o.width, "Hidden width")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{8192}))
      ->capture_default_str();
  app.add_option("--features", o.features, "Input features")
      ->check(CLI::Range(std::int64_t{2}, std::int64_t{4096}))
      ->capture_default_str();
  app.add_option("--samples", o.samples, "Dataset size")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 24))
      ->capture_default_str();
  app.add_option("--global-batch", o.global_batch, "Samples per step over all ranks")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 20))
      ->capture_default_str();
  app.add_option("--steps", o.steps, "Steps per mode (the first is not timed)")
      ->check(CLI::Range(2, 100000))
      ->capture_default_str();
  app.add_option("--lr", o.lr, "SGD learning rate")->check(cli::PositiveFinite)->capture_default_str();
  app.add_option("--bucket-mb", o.bucket_mb, "Bucket cap in MB (PyTorch's bucket_cap_mb)")
      ->check(cli::PositiveFinite & CLI::Range(0.0, 1e6))
      ->capture_default_str();
  app.add_option("--first-bucket-mb", o.first_bucket_mb, "Cap of the first bucket in MB")
      ->check(cli::PositiveFinite & CLI::Range(0.0, 1e6))
      ->capture_default_str();
  cli::add_sim_network_option(app, o.sim_network);
  app.add_option("--trace", o.trace, "Write the timeline of the last overlapped step here (Chrome trace JSON)")
      ->check(cli::OutputFile)->capture_default_str();
  app.add_option("--comm-hook", o.comm_hook, "How buckets travel: none (float32), fp16 or bf16 (half the bytes)")
      ->check(CLI::IsMember({"none", "fp16", "bf16"}))
      ->capture_default_str();
  app.add_flag("--sweep-buckets", o.sweep_buckets, "Also time buckets+overlap at caps from 0.25 to 100 MB");
  cli::add_fault_options(app, o.faults,
                         {{"skip-bucket", "the first bucket of each backward is never all-reduced"},
                          {"launch-early", "the first bucket is launched before its last gradient is in"},
                          {"step-early", "the optimizer steps before the last bucket's average lands"}});
  app.add_flag(
      "--verify,!--no-verify", o.verify,
      "Check every mode, every step, against one rank in lock-step (on by default; --no-verify for timing runs)");
  return cli::run(app, argc, argv, [&] {
    o.samples_given = app.count("--samples") > 0;
    cli::check_fault_options(o.faults, o.steps);
    if (o.faults.fault != "none" && !o.verify) throw UsageError("--fault: a fault is for --verify to catch; drop --no-verify");
    cli::Session session = cli::start_session(o.common, o.distributed);
    return run(o, session);
  });
}
