// Chapter 08: when the model does not fit on one device, split it. Four lessons, a file each, read in
// order, which train_grid below composes into one step:
//   1. tensor_parallel.cpp: tensor and sequence parallelism, every layer split across a TP group
//      (Megatron-LM: attention's heads, the MLP's hidden units, the vocabulary).
//   2. pipeline.cpp: pipeline parallelism, the layers in stages that pass micro-batches along by a
//      schedule (GPipe, 1F1B, interleaved 1F1B, zero bubble).
//   3. context_parallel.cpp: context parallelism, every sequence split, attention seeing all of it by a
//      ring of key-value blocks or by all-to-alls.
//   4. grid.cpp: the TP x CP x PP x DP grid, each rank's part made, data parallelism on top.
// The topology (common/parallel/topology.h) owns the grid; nothing here computes a rank. --verify
// (verify_grid.cpp) checks every step in lock-step against the unsharded model on the whole global batch:
// the grid's gradient, its loss and its update. With --precision bf16|fp16 the forward runs under
// autocast over float32 masters (chapter 04's mixed precision), and the row-parallel sums travel in 16
// bits; --verify then checks each micro-batch against a reference that rounds as the run does (the split
// model's TP ranks on threads, verify_grid.h). Below the fence: the sweep and the report.
#include "08_tensor_pipeline/context_parallel.h"   // lesson 3: sequences split, attention over the CP group
#include "08_tensor_pipeline/grid.h"               // lesson 4: the grid, each rank's part of the model
#include "08_tensor_pipeline/pipeline.h"           // lesson 2: run_stages, the schedule played
#include "08_tensor_pipeline/schedule.h"           // lesson 2: the 1F1B schedule, as data (exercise 08.1)
#include "08_tensor_pipeline/tensor_parallel.h"    // lesson 1: accumulate, clip_across_the_grid
#include "08_tensor_pipeline/options.h"            // the chapter's flags
#include "08_tensor_pipeline/report.h"             // the stages' figures, the timeline
#include "08_tensor_pipeline/verify_grid.h"        // --verify
#include "common/comm/agree.h"                     // all_reduce_scalar: the replicas' mean loss
#include "common/cli/precision_options.h"        // --tf32
#include "common/cli/limits.h"                     // --mem-limit-mb
#include "common/cli/session.h"                    // device, topology (the grid) and metrics
#include "common/comm/environment.h"               // MPI start-up
#include "common/comm/simulated_network.h"         // --sim-network: an alpha-beta delay per message
#include "common/core/log.h"                       // rank 0 prints
#include "common/data/sampling.h"                 // SampleStream: every step a whole global batch
#include "common/parallel/replicas.h"              // on_rank0

using namespace course;
using namespace course::chapter08;

namespace {

// One training run on the grid with `m` micro-batches and `schedule`. With `verified`, every step is
// checked in lock-step against the unsharded model (verify_grid.h).
GridRun train_grid(const Options& o, const ChapterTask& task, parallel::Topology& topology, Device device,
                   const std::string& schedule, int m, metrics::MetricsWriter* metrics, bool verified = false) {
  // This rank's part of the model (its stage's layers, split across its TP group), and DDP on the DP
  // group: every rank made the whole model from the same seed and kept its part.
  GridRun run = make_grid_model(o, task, topology, device);
  // Every step takes the next whole global batch of the stream, across epochs (chapter 06's order), so
  // every micro-batch has the same size; each replica takes its share.
  data::SampleStream stream(task.task.size, o.common.seed);
  // AdamW, warm-up and cosine decay, as GPT-2 trains (the course's adamw recipe); the clip is the grid's
  // own. With --precision bf16|fp16 the parameters stay float32 masters and the forward runs under
  // autocast; fp16's loss scale is agreed over the whole grid, every rank skipping the same steps.
  optim::Recipe training(run.model->parameters(),
                         {.name = "adamw", .lr = o.training.lr, .total_steps = o.training.steps,
                          .precision = o.precision.dtype(), .loss_scale = o.precision.loss_scale},
                         &topology.world());
  // --verify: the unsharded model beside the grid, in lock-step (verify_grid.h); without it, no check.
  const auto check = verify::check_if(verified, [&] { return std::make_unique<GridCheck>(o, task, run, topology, training); });
  StepFigures figures(o.training.steps);
  const std::int64_t cp_before = run.cp ? run.cp->bytes_sent() : 0;
  for (std::int64_t step = 0; step < o.training.steps; ++step) {
    figures.begin_step();
    check->begin_step(step);
    auto parts = micro_batches(stream.take(step * o.training.global_batch, o.training.global_batch), topology.dp_rank(),
                               topology.dp_size(), m);
    // 1. Forward and backward over this replica's micro-batches: through the stages by the schedule,
    //    or one after the other when TP alone splits the model. DDP averages over the DP group in the
    //    last backward.
    const parallel::PipelineStep result = topology.pp_size() > 1
                                              ? run_stages(run, task, topology, parts, schedule, training, device)
                                              : accumulate(run, task, parts, training, device);
    // 2. What the split left to add up, in Megatron-LM's finalize_model_grads order: the sequence-
    //    parallel sums over TP, then the tied table's two halves across the pipeline.
    parallel::finish_gradients(*run.model);
    // The replicas' mean (with --cp each rank's loss is its tokens' share times CP: averaged with them).
    const float loss = comm::all_reduce_scalar(topology.dp_cp_group(), result.loss, comm::ReduceOp::average);
    check->check_gradient(step, loss);
    // 3. Clip by the whole model's norm, summed over TP and the stages, and step (fp16 skips a step
    //    whose gradients overflowed anywhere in the grid).
    const Tensor norm = training.step(step, [&] { return o.clip > 0 ? clip_across_the_grid(run, topology, o.clip) : Tensor(); });
    check->check_update(step, optim::norm_value(norm));
    figures.end_step(step, result, check->take_ms());  // the check's own time left out
    run.losses.push_back(loss);
    if (metrics && (step % o.log_every == 0 || step + 1 == o.training.steps)) {
      log("step %4lld  loss %.6f\n", static_cast<long long>(step), run.losses.back());
      metrics->write({{"event", "step"}, {"step", step}, {"loss", run.losses.back()}});
    }
  }
  if (run.cp) run.cp_bytes = (run.cp->bytes_sent() - cp_before) / std::max<std::int64_t>(1, o.training.steps);
  if (check->checks()) run.check = check->finish();
  run.skipped_steps = training.scaler().skipped_steps();
  figures.finish(run, topology);
  return run;
}

// ---------------------------------------------------------------------------------------------------
// Below: the schedules swept, the run set up on its grid, and what it reports.

// --sweep: every schedule at m = 1, 2, 4, 8 and 16, their bubbles against the theory and their
// activations as metrics (scripts/plot.py pipeline draws them); with --trace, each schedule's timeline
// at 4 micro-batches.
int sweep(const Options& o, const ChapterTask& task, parallel::Topology& topology, Device device,
          metrics::MetricsWriter& metrics, const std::string& network) {
  const std::vector<int> counts = {1, 2, 4, 8, 16};
  if (o.training.global_batch % (static_cast<std::int64_t>(topology.dp_size()) * 16) != 0)
    throw UsageError("--global-batch: --sweep runs up to 16 micro-batches per replica, so " +
                     std::to_string(o.training.global_batch) + " must divide by DP x 16 (" +
                     std::to_string(topology.dp_size() * 16) + ")");
  const std::string stem = o.trace.substr(0, o.trace.rfind('.'));
  // Interleaved 1F1B with --virtual-stages (2 by default here) where the layers divide into its chunks,
  // at the counts that are multiples of the stages.
  const int p = topology.pp_size(), v = std::max(2, o.virtual_stages);
  const bool interleaves = task.config.n_layer % (p * v) == 0;
  // Zero bubble without replicas (its weights' gradients come after DDP would have averaged them).
  const bool zero_bubble = topology.dp_cp_group().size() == 1;
  for (const std::string schedule : {"gpipe", "1f1b", "interleaved", "zero-bubble"})
    for (int m : counts) {
      if (schedule == "interleaved" && (!interleaves || m % p != 0)) continue;
      if (schedule == "zero-bubble" && !zero_bubble) continue;
      Options swept = o;
      swept.schedule = schedule;
      swept.virtual_stages = schedule == "interleaved" ? v : 1;
      GridRun run = train_grid(swept, task, topology, device, schedule, m, nullptr);
      report_stages(run, m, schedule, metrics, "pipeline_sweep", network);
      if (m == 4 && !o.trace.empty())  // each schedule's timeline, with --trace (rank 0 writes)
        parallel::on_rank0(topology.world(), [&] {
          write_timeline(run, stem + "_" + schedule + ".json",
                         schedule + ", " + std::to_string(topology.pp_size()) +
                             " stages, 4 micro-batches: the last step" + network);
        });
    }
  log("charts: python3 scripts/plot.py pipeline %s PREFIX (PREFIX_bubble.png, PREFIX_activations.png)\n",
      o.common.metrics.empty() ? "METRICS (run with --metrics FILE)" : o.common.metrics.c_str());
  log("PASSED\n");
  return 0;
}

int run(Options o, cli::Session& session) {
  // --sim-network: the same grid over a world whose every message takes at least the alpha-beta time
  // (chapter 05's decorator), so each group, TP, PP and DP, pays it on its own link.
  std::unique_ptr<parallel::Topology> simulated;
  std::string network;  // ", simulated network: alpha 10 us, 1.25 GB/s"
  if (comm::SimulatedWorld world = comm::simulated_world(session.topology->world(), o.sim_network); world.communicator) {
    simulated = std::make_unique<parallel::Topology>(std::move(world.communicator), parallel::GridShape{o.tp, o.pp, o.dp, o.cp});
    network = ", simulated network: " + world.description;
  }
  parallel::Topology& topology = simulated ? *simulated : *session.topology;
  const Device device = session.device;
  const ChapterTask task = make_task(o, device);
  o.training.global_batch = check_grid(o, task, topology);  // the default rounded up to fit the grid
  const std::string limit = cli::apply_memory_limit(o.mem_limit_mb, device);  // --mem-limit-mb
  if (o.verify) check_verifiable(o, topology);  // 16 bits by their parts, where a reference can repeat them
  log_start(o, task, topology, network, limit);
  if (o.sweep) {
    if (topology.pp_size() < 2) throw UsageError("--sweep: needs a pipeline (--pp 2 or more)");
    return sweep(o, task, topology, device, session.metrics, network);
  }
  if (topology.pp_size() > 1)
    log("%s", parallel::describe(schedule_for(o.schedule, topology.pp_size(), o.micro_batches, o.virtual_stages)).c_str());
  cli::arm_faults(o.faults, o.verify, o.training.steps);
  GridRun run = train_grid(o, task, topology, device, o.schedule, o.micro_batches, &session.metrics, o.verify);
  report_run(o, task, topology, run, network, session.metrics);
  const bool passed = !o.verify || report_check(run.check, task, checked_by_parts(o, topology),
                                                     checked_on_split_layers(o, topology, task), topology.tp_size() * topology.cp_size(),
                                                     session.metrics);
  log("%s\n", passed ? "PASSED" : "FAILED");
  return passed ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  comm::Environment env(argc, argv);
  cli::Program program{"Chapter 08: tensor, sequence, context and pipeline parallelism, with data parallelism on top"};
  Options o;
  add_options(program.app(), o);
  return program.run(argc, argv, [&] {
    auto session = cli::start_session(o.common, o.distributed, parallel::GridShape{o.tp, o.pp, o.dp, o.cp});
    cli::apply_precision(o.precision, session.device);  // --tf32 on a GPU
    return run(o, session);
  });
}
