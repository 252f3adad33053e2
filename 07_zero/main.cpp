// Chapter 07: ZeRO. Data parallelism keeps a whole copy of the model states on every rank: 16 bytes per
// parameter with float32 AdamW (4 the parameter, 4 its gradient, 8 Adam's two moments). ZeRO shards
// them: stage 1 the optimizer state, stage 2 the gradients too, stage 3 the parameters too
// (common/parallel/zero.h; stage 0 is chapter 04's data parallelism, every gradient all-reduced). With
// --precision bf16|fp16 the parameters and gradients are 16-bit over float32 masters, the paper's
// mixed-precision accounting: 2 + 2 + 12 bytes a parameter, sharded the same way. With --offload
// (ZeRO-Offload) the masters and Adam's moments live in host memory and AdamW runs on the CPU. The
// lesson is train() below: the stage is one field of ZeroOptions, and the loop is the same at every
// stage: forward and backward, reduce_gradients, apply. The program prints where every byte went
// beside the paper's formula and the bytes each rank sent beside the theory (report.cpp), and with
// --verify checks every step in lock-step against the whole model on one rank (verify_zero.cpp).
// --compare runs all four stages one after the other, each checked so.
#include <algorithm>
#include <chrono>
#include <cmath>

#include "07_zero/checkpoints.h"                 // --ckpt-dir's sharded checkpoints, loaded and saved
#include "07_zero/options.h"                     // the chapter's flags
#include "07_zero/report.h"                      // memory and bytes against the formulas, the verdict, the files
#include "07_zero/shards.h"                      // the lesson: the pieces of the parameters a rank owns
#include "07_zero/verify_zero.h"                 // --verify: the whole model beside the shards
#include "common/comm/agree.h"                   // all_reduce_scalar: the ranks' mean loss
#include "common/cli/precision_options.h"        // --tf32
#include "common/cli/limits.h"                   // --mem-limit-mb
#include "common/cli/session.h"                  // device, topology and metrics, set up once
#include "common/comm/environment.h"             // MPI start-up
#include "common/comm/simulated_network.h"       // --sim-network: an alpha-beta delay per message
#include "common/core/log.h"                     // rank 0 prints
#include "common/core/memory.h"                  // the per-category counters, the budget
#include "common/nn/tasks.h"                     // the model, its data and its loss
#include "common/ops/ops.h"                      // scale
#include "common/parallel/distributed_sampler.h" // each rank's share of the data
#include "common/parallel/replicas.h"            // on_rank0
#include "common/parallel/zero.h"                // ZeroOptimizer, stages 0-3
#include "common/verify/compare.h"               // max_abs_diff

using namespace course;
using namespace course::chapter07;
using Clock = std::chrono::steady_clock;

namespace {

double ms_since(Clock::time_point begin) {
  return std::chrono::duration<double, std::milli>(Clock::now() - begin).count();
}

// One run of a stage: which, and what applies to it.
struct RunPlan {
  int stage = 0;
  bool prefetch = false;      // stage 3 gathers the next unit ahead
  bool checkpointed = false;  // --ckpt-dir, --resume, --save and --fail-at-step apply to this run
  bool verified = false;      // checked in lock-step against the whole model
};

// One run at `plan.stage`. The chosen stage's run writes --ckpt-dir's checkpoints and, with --resume,
// starts from the newest.
StageRun train(const Options& o, const RunPlan& plan, const nn::TrainingTask& task, std::int64_t global_batch,
               comm::Communicator& group, Device device, metrics::MetricsWriter& metrics) {
  StageRun run = begin_run(device);  // the memory counters before it, to measure the run against
  auto model = task.make_model(o.common.seed);  // every rank makes it alike; ZeRO keeps each rank's part
  // The stages are one option: what each rank keeps only its part of, the optimizer state (1), the
  // gradients (2), the parameters (3). The rest (AdamW, clipping, precision, offload) is every stage's.
  parallel::ZeroOptions options = zero_options(o);
  options.stage = plan.stage, options.prefetch = plan.prefetch;
  options.owned_segments = chapter07::owned_segments;  // which pieces of each unit this rank updates (shards.cpp)
  parallel::ZeroOptimizer zero(*model, group, options);
  parallel::DistributedSampler sampler(task.size, group, o.common.seed);
  const std::int64_t local_batch = global_batch / group.size();
  Checkpoints checkpoints(o, plan.checkpointed, group, zero, *model, task.description, global_batch);
  run.first_step = checkpoints.load();  // 0, or with --resume the newest good checkpoint's step
  const auto check = verify::check_if(plan.verified, [&] {  // --verify: the whole model beside the shards
    return std::make_unique<ZeroCheck>(task, zero, options, sampler, group, o.common.seed, global_batch, o.accum,
                                       run.first_step); });
  reset_peak_memory(device);
  for (std::int64_t step = run.first_step; step < o.training.steps; ++step) {
    const auto begin = Clock::now();
    check->begin_step(step);
    const auto share = sampler.batch(step, local_batch);
    double local_loss = 0;
    for (const auto& batch : data::split_batches(share, (local_batch + o.accum - 1) / o.accum)) {
      const float weight = static_cast<float>(batch.size()) / static_cast<float>(share.size());
      local_loss += zero.forward_backward([&] { return scale(task.loss(*model, batch), weight); }).item();
    }
    zero.reduce_gradients();  // 0 all-reduces; 1 reduce-scatters; 2 and 3 did, unit by unit, during backward
    const float loss = comm::all_reduce_scalar(group, static_cast<float>(local_loss), comm::ReduceOp::average);
    check->check_gradient(step, loss);
    const double norm = zero.apply();  // clip, AdamW on this rank's part (skipped by fp16 on overflow), all-gather
    check->check_update(step, norm);
    zero.zero_grad();
    record_step(o, run, zero, step, loss, ms_since(begin) - check->take_ms(), norm);
    checkpoints.save_if_due(step + 1);
  }
  finish_run(o, run, zero, *check, plan.checkpointed, *model, group, device, metrics);
  return run;
}

// ---------------------------------------------------------------------------------------------------
// Below: the stages run and reported, and the checkpoints' plumbing. The lesson is above.

int run(const Options& o, cli::Session& session) {
  comm::Communicator& world = session.topology->dp_group();
  if (!o.consolidate.empty()) {
    parallel::on_rank0(world, [&] { consolidate(o); });
    return 0;
  }
  const comm::SimulatedWorld simulated = comm::simulated_world(world, o.sim_network);  // --sim-network
  const std::string& network = simulated.description;  // "alpha 10 us, 1.25 GB/s"
  const std::string label = network.empty() ? "" : ", simulated network: " + network;  // for the log
  comm::Communicator& group = simulated.communicator ? *simulated.communicator : world;
  const Device device = session.device;
  const int ranks = group.size();
  check_options(o, ranks);
  const nn::TrainingTask task = cli::training_task(o.models, o.mlp, o.training.global_batch, o.verify || o.compare ? 2 : 1,
                                                   group.local_size(), device, o.common.seed);
  const std::int64_t global_batch = cli::global_batch_for(o.training, ranks, o.accum, task.size);
  const std::string limit = cli::apply_memory_limit(o.mem_limit_mb, device);
  log("ZeRO: %d ranks, %s, global batch %lld, %lld steps, AdamW lr %g, clip %g, %s%s%s%s%s\n", ranks,
      task.description.c_str(), static_cast<long long>(global_batch), static_cast<long long>(o.training.steps), o.training.lr, o.clip,
      cli::precision_description(o.precision).c_str(),
      o.prefetch ? ", stage 3 prefetching" : "",
      o.offload == "none"        ? ""
      : o.offload == "optimizer" ? ", optimizer state offloaded to the host"
                                 : ", optimizer state and parameters offloaded to the host",
      label.c_str(),
      limit.c_str());
  if (o.kill.armed()) log("fault injection: %s\n", o.kill.describe().c_str());
  bool passed = true;
  std::vector<StageRun> runs;
  if (o.compare) {
    // Every stage, checked in lock-step; with --prefetch, stage 3 twice, gathering on demand and ahead.
    for (int stage = 0; stage <= 3; ++stage) runs.push_back(train(o, {stage, false, false, true}, task, global_batch, group, device, session.metrics));
    if (o.prefetch) runs.push_back(train(o, {3, true, false, true}, task, global_batch, group, device, session.metrics));
    price_stages(o, runs, ranks, global_batch, session.metrics);  // --predict: the cost model beside each
    print_memory_table(runs, ranks, network);
    for (const StageRun& r : runs) passed = report_check(r) && passed;
    // Free-running, the stages' final parameters differ by their summation orders only: a figure, not a verdict.
    for (std::size_t i = 1; i < runs.size(); ++i)
      log("stage %d%s's final parameters differ from stage 0's by at most %.3g\n", runs[i].stage,
          runs[i].prefetch ? " (prefetching)" : "", verify::max_abs_diff(runs[i].parameters, runs[0].parameters));
    suggest_charts(o);
  } else {
    log("stage %d\n", o.stage);
    runs.push_back(train(o, {o.stage, o.prefetch, true, o.verify}, task, global_batch, group, device, session.metrics));
    price_stages(o, runs, ranks, global_batch, session.metrics);
    print_memory_table(runs, ranks, network);
    log("final parameter checksum %016llx (step %lld)\n", static_cast<unsigned long long>(runs[0].checksum),
        static_cast<long long>(o.training.steps));
    if (o.verify) passed = report_check(runs[0]);
  }
  log("%s\n", passed ? "PASSED" : "FAILED");
  return passed ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  comm::Environment env(argc, argv);
  cli::Program program{"Chapter 07: ZeRO stages 0-3, memory and communication against the formulas"};
  Options o;
  add_options(program.app(), o);
  return program.run(argc, argv, [&] {
    check_options(o);
    auto session = cli::start_session(o.common, o.distributed);
    cli::apply_precision(o.precision, session.device);  // --tf32 on a GPU
    return run(o, session);
  });
}
