// Chapter 05: gradient buckets and overlap. The same model, data and steps, synchronised four ways:
// chapter 04's one all-reduce per gradient after backward, one flat all-reduce after backward, buckets
// after backward, and buckets launched while backward is still running: four settings of PyTorch's DDP
// (common/parallel/reducer.h). Each prints its step time split into compute and exposed communication,
// and is checked in lock-step against one rank. Below the fence: the faults, the bucket sweep, the
// timeline and the report.
#include <algorithm>
#include <chrono>

#include "05_bucketing_overlap/buckets.h"         // the lesson: which gradients travel together
#include "05_bucketing_overlap/checks.h"          // --verify and --fault
#include "05_bucketing_overlap/options.h"         // the chapter's flags
#include "05_bucketing_overlap/report.h"          // the table, the metrics, the timeline
#include "common/checkpoint/parameters.h"         // --save: the final parameters as safetensors
#include "common/cli/precision_options.h"        // --tf32
#include "common/cli/session.h"                   // device, topology and metrics, set up once
#include "common/comm/environment.h"              // MPI start-up
#include "common/comm/simulated_network.h"        // --sim-network: an alpha-beta delay per message
#include "common/core/log.h"                      // rank 0 prints
#include "common/nn/tasks.h"                      // the MLP or the GPT, and its loss
#include "common/optim/recipe.h"                  // SGD, in the run's precision
#include "common/parallel/comm_hooks.h"           // --comm-hook: fp16 and bf16 compression
#include "common/parallel/ddp.h"                  // DistributedDataParallel over the Reducer's buckets
#include "common/parallel/distributed_sampler.h"  // each rank's share of the data
#include "common/parallel/replicas.h"             // on_rank0

using namespace course;
using namespace course::chapter05;
using Clock = std::chrono::steady_clock;

namespace {

// The four ways differ only in the Reducer's options: how many buckets, and whether a bucket goes out as
// soon as its last gradient is in (during backward) or when backward has finished.
struct Mode {
  std::string name;
  parallel::ReducerOptions options;
};

// A cap below any parameter's size: every bucket holds one parameter, chapter 04's one message per gradient.
constexpr double kOneParameterPerBucketMb = 1e-6;

std::vector<Mode> modes(const Options& o) {
  Mode per_parameter{"per-parameter", {}}, flat{"flat", {}}, buckets{"buckets", {}}, overlap{"buckets+overlap", {}};
  for (Mode* m : {&per_parameter, &flat, &buckets, &overlap}) m->options.assign_buckets = chapter05::assign_buckets;
  per_parameter.options.bucket_cap_mb = per_parameter.options.first_bucket_mb = kOneParameterPerBucketMb;
  per_parameter.options.overlap = false;
  flat.options.bucket_cap_mb = flat.options.first_bucket_mb = 1e9;  // one bucket holds everything
  flat.options.overlap = false;
  for (Mode* m : {&buckets, &overlap}) {
    m->options.bucket_cap_mb = o.bucket_mb;
    m->options.first_bucket_mb = o.first_bucket_mb;
  }
  buckets.options.overlap = false;
  overlap.options.record_timeline = true;
  return {per_parameter, flat, buckets, overlap};
}

// --comm-hook, the function that sends a bucket (below the fence).
void install_hook(const Options& o, parallel::DistributedDataParallel& ddp);

ModeResult train(const Options& o, parallel::DistributedDataParallel& ddp, const nn::TrainingTask& task,
                 std::int64_t global_batch, std::int64_t steps) {
  comm::Communicator& group = ddp.communicator();
  nn::Module& model = ddp.module();
  install_hook(o, ddp);  // --comm-hook: how a bucket is sent
  // SGD in the run's precision (--precision: fp16 scales the loss, common/optim/recipe.h).
  optim::Recipe training(model.parameters(),
                         {.name = "sgd", .lr = o.training.lr, .total_steps = steps, .precision = o.precision.dtype(),
                          .loss_scale = o.precision.loss_scale},
                         &group);
  parallel::DistributedSampler sampler(task.size, group, o.common.seed);
  const std::int64_t local = global_batch / group.size();
  const auto check = verify::check_if(o.verify, [&] {  // --verify: one rank beside the run, in lock-step
    return make_check(o, task, group, sampler, local, training, model);
  });
  ModeResult result;
  std::int64_t bytes_before = 0;
  for (std::int64_t step = 0; step < steps; ++step) {
    check->begin_step(step);
    const auto share = sampler.batch(step, local);
    if (step == 1) bytes_before = ddp.stats().bytes;
    group.barrier();  // every rank starts the step together, so the times compare
    const auto begin = Clock::now();
    // The buckets' all-reduces run inside backward: overlapped, or all at its end (without overlap).
    const Tensor loss = training.forward_backward([&] { return task.loss(model, share); });
    const double step_ms = std::chrono::duration<double, std::milli>(Clock::now() - begin).count();
    const double exposed = ddp.stats().exposed_ms;
    if (step > 0) {  // the first step allocates and rebuilds the buckets
      result.step_ms += step_ms / static_cast<double>(steps - 1);
      result.exposed_ms += exposed / static_cast<double>(steps - 1);
    }
    check->check_gradient(step, loss.item());
    training.step(step);  // in fp16, skipped by every rank if the gradient overflowed
    check->check_update(step, 0.0);  // SGD, unclipped
  }
  result.messages = ddp.stats().messages_per_step;
  result.bytes_per_step = (ddp.stats().bytes - bytes_before) / std::max<std::int64_t>(1, steps - 1);
  result.parameters = model.parameters_to_host();
  if (check->checks()) result.check = check->finish();
  return result;
}

ModeResult train(const Options& o, const Mode& mode, comm::Communicator& group, const nn::TrainingTask& task,
                 std::int64_t global_batch, std::int64_t steps) {
  // Every rank starts from its own initialisation; each DDP broadcasts rank 0's.
  auto model = task.make_model(o.common.seed + static_cast<std::uint64_t>(group.rank()));
  parallel::DistributedDataParallel ddp(model, group, mode.options);
  ModeResult r = train(o, ddp, task, global_batch, steps);
  r.model = model;
  r.timeline = ddp.reducer().last_timeline();
  return r;
}

void sweep_buckets(const Options& o, comm::Communicator& group, const nn::TrainingTask& task, std::int64_t global_batch,
                   const std::string& label, metrics::MetricsWriter& metrics);  // below the fence

int run(const Options& o, cli::Session& session) {
  comm::Communicator& world = session.topology->dp_group();
  const nn::TrainingTask task = cli::training_task(o.models, o.mlp, o.training.global_batch, o.verify ? 2 : 1,
                                                   world.local_size(), session.device, o.common.seed);
  const std::int64_t global_batch = cli::global_batch_for(o.training, world.size(), 1, task.size);
  const comm::SimulatedWorld simulated = comm::simulated_world(world, o.sim_network);  // --sim-network
  const std::string label = simulated.communicator ? " (simulated network: " + simulated.description + ")" : "";
  comm::Communicator& group = simulated.communicator ? *simulated.communicator : world;
  log("Chapter 05: %d ranks, %s, global batch %lld, %lld steps, %s, comm hook %s%s\n", group.size(),
      task.description.c_str(), static_cast<long long>(global_batch), static_cast<long long>(o.training.steps),
      cli::precision_description(o.precision).c_str(), o.comm_hook.c_str(), label.c_str());
  print_table_header();
  bool passed = true;
  std::vector<float> first;
  ModeResult no_overlap, overlapped;
  for (const Mode& mode : modes(o)) {
    ModeResult r = train(o, mode, group, task, global_batch, o.training.steps);
    passed = report_mode(o, mode.name, r, first, group.size(), global_batch, label, session.metrics) && passed;
    if (first.empty()) first = r.parameters;
    if (mode.name == "buckets") no_overlap = r;
    if (mode.name == "buckets+overlap") overlapped = r;
  }
  const double hidden = no_overlap.exposed_ms > 0 ? overlapped.exposed_ms / no_overlap.exposed_ms : 0.0;
  log("overlap leaves %.2f of the bucketed communication exposed (%.2f ms of %.2f ms)%s\n", hidden,
      overlapped.exposed_ms, no_overlap.exposed_ms, label.c_str());
  // The lesson in one line: without overlap a step is compute + communication; overlap can bring it
  // down to max(compute, communication), no further.
  const double compute = no_overlap.step_ms - no_overlap.exposed_ms, serial = no_overlap.step_ms;
  const double ideal = std::max(compute, no_overlap.exposed_ms);
  log("step: %.2f ms = compute %.2f + communication %.2f with buckets after backward; overlapped %.2f ms, against "
      "max(compute, communication) = %.2f ms, the most overlap can reach%s\n",
      serial, compute, no_overlap.exposed_ms, overlapped.step_ms, ideal, label.c_str());
  if (overlapped.step_ms > serial - 0.25 * (serial - ideal))
    log("%s\n", why_overlap_gains_little(session.device, world.backend_name(), label).c_str());

  // ------------------------------------------------------------------------------------------------
  // Below: the timeline, the sweep, the saved model and the verdict.
  write_trace(o, group, overlapped.timeline, label);
  if (o.sweep_buckets) sweep_buckets(o, group, task, global_batch, label, session.metrics);
  if (!o.save.empty())
    parallel::on_rank0(group, [&] {  // the ranks hold the same parameters: rank 0 writes them
      checkpoint::save_parameters(o.save, *overlapped.model, {{"chapter", "05_bucketing_overlap"},
                                                              {"mode", "buckets+overlap"},
                                                              {"steps", std::to_string(o.training.steps)}});
      log("parameters (buckets+overlap) saved to %s\n", o.save.c_str());
    });
  session.metrics.write({{"event", "overlap_summary"}, {"exposed_fraction", hidden}, {"passed", passed},
                         {"verified", o.verify}, {"ranks", group.size()}, {"simulated_network", label}});
  log("%s\n", passed ? "PASSED" : "FAILED");
  return passed ? 0 : 1;
}

// Step time against the bucket cap, buckets+overlap, a few steps each without the check.
void sweep_buckets(const Options& o, comm::Communicator& group, const nn::TrainingTask& task, std::int64_t global_batch,
                   const std::string& label, metrics::MetricsWriter& metrics) {
  log("\nstep time against the bucket cap (buckets+overlap)%s:\n%10s %8s %10s %10s\n", label.c_str(), "cap(MB)",
      "buckets", "step(ms)", "exposed");
  for (double cap : {0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 25.0, 50.0, 100.0}) {
    Mode m{"sweep", {}};
    m.options.assign_buckets = chapter05::assign_buckets;
    m.options.bucket_cap_mb = cap;
    m.options.first_bucket_mb = std::min(cap, o.first_bucket_mb);
    Options quick = o;
    quick.verify = false;
    ModeResult r = train(quick, m, group, task, global_batch, std::min<std::int64_t>(o.training.steps, 5));
    log("%10.2f %8zu %10.2f %10.2f\n", cap, r.messages, r.step_ms, r.exposed_ms);
    metrics.write({{"event", "bucket_sweep"}, {"bucket_mb", cap}, {"buckets", r.messages}, {"step_ms", r.step_ms},
                   {"exposed_ms", r.exposed_ms}, {"simulated_network", label}});
  }
}

// --comm-hook, and --fault around it. The Reducer's buckets are read when the hook runs (they are
// rebuilt after step 0).
void install_hook(const Options& o, parallel::DistributedDataParallel& ddp) {
  auto layout = [&reducer = ddp.reducer()] {
    return Messages{reducer.buckets().size(), reducer.buckets().front().offsets.back()};
  };
  ddp.register_comm_hook(with_fault(parallel::comm_hook_named(o.comm_hook), layout));
}

}  // namespace

int main(int argc, char** argv) {
  comm::Environment env(argc, argv);
  cli::Program program{"Chapter 05: gradient buckets and overlap of communication with backward"};
  Options o;
  add_options(program.app(), o);
  return program.run(argc, argv, [&] {
    check_options(o);
    cli::Session session = cli::start_session(o.common, o.distributed);
    cli::apply_precision(o.precision, session.device);  // --tf32 on a GPU
    return run(o, session);
  });
}
