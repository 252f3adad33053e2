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
#include <cstdio>
#include <optional>

#include "07_zero/options.h"                     // the chapter's flags
#include "07_zero/report.h"                      // memory and bytes against the formulas, the verdict, the files
#include "07_zero/verify_zero.h"                 // --verify: the whole model beside the shards
#include "common/comm/agree.h"                   // all_reduce_scalar: the ranks' mean loss
#include "common/checkpoint/resume.h"            // prepare_checkpoint_folder
#include "common/checkpoint/sharded.h"           // ShardedFolder: one file per rank and an index
#include "common/cli/precision_options.h"        // --tf32
#include "common/cli/limits.h"                   // --mem-limit-mb
#include "common/cli/session.h"                  // device, topology and metrics, set up once
#include "common/comm/environment.h"             // MPI start-up
#include "common/comm/simulated_network.h"       // --sim-network: an alpha-beta delay per message
#include "common/core/log.h"                     // rank 0 prints
#include "common/core/memory.h"                  // the per-category counters, the budget
#include "common/nn/tasks.h"                     // the model, its data and its loss
#include "common/ops/autocast.h"                 // --precision bf16|fp16: the forward's matrix products in 16 bits
#include "common/ops/ops.h"                      // scale
#include "common/optim/recipe.h"                 // kGpt2AdamW: GPT-2's AdamW settings
#include "common/parallel/distributed_sampler.h" // each rank's share of the data
#include "common/parallel/replicas.h"            // on_rank0
#include "common/parallel/zero.h"                // ZeroOptimizer, stages 0-3
#include "common/parallel/zero_checkpoint.h"     // sharded checkpoints
#include "common/verify/compare.h"               // max_abs_diff

using namespace course;
using namespace course::chapter07;
using Clock = std::chrono::steady_clock;

namespace {

// One run of a stage: which, and what applies to it.
struct RunPlan {
  int stage = 0;
  bool prefetch = false;      // stage 3 gathers the next unit ahead
  bool checkpointed = false;  // --ckpt-dir, --resume and --save apply to this run
  bool verified = false;      // checked in lock-step against the whole model
};

checkpoint::Metadata settings(const Options& o, int stage, const nn::TrainingTask& task, std::int64_t global_batch);
std::int64_t resume(const Options& o, const checkpoint::ShardedFolder& folder, comm::Communicator& group,
                    parallel::ZeroOptimizer& zero, const checkpoint::Metadata& settings);
void save(const Options& o, const checkpoint::ShardedFolder& folder, comm::Communicator& group,
          parallel::ZeroOptimizer& zero, const nn::Module& model, std::int64_t step, const checkpoint::Metadata& settings);

// One run at `plan.stage`. The chosen stage's run writes --ckpt-dir's checkpoints and, with --resume,
// starts from the newest.
StageRun train(const Options& o, const RunPlan& plan, const nn::TrainingTask& task, std::int64_t global_batch,
               comm::Communicator& group, Device device, metrics::MetricsWriter& metrics) {
  const int ranks = group.size(), stage = plan.stage;
  StageRun run;
  run.stage = stage;
  run.prefetch = plan.prefetch && stage == 3;
  const MemoryStats before = memory_stats(device), host_before = memory_stats(Device::cpu);
  auto model = task.make_model(o.common.seed);  // every rank makes it alike; ZeRO keeps each rank's part
  run.psi = static_cast<double>(model->parameter_count());
  // The stages are one option: what each rank keeps only its part of, the optimizer state (1), the
  // gradients (2), the parameters (3). AdamW as GPT-2 trains (betas 0.9, 0.95, decay 0.1), clipped.
  parallel::ZeroOptions options;
  options.stage = stage;
  options.lr = o.training.lr;
  options.beta1 = optim::kGpt2AdamW.beta1, options.beta2 = optim::kGpt2AdamW.beta2;
  options.eps = optim::kGpt2AdamW.eps, options.weight_decay = optim::kGpt2AdamW.weight_decay;
  options.max_grad_norm = o.clip;
  options.prefetch = plan.prefetch;
  // Mixed precision: 16-bit parameters and gradients, float32 masters beside Adam's moments (K = 12).
  options.precision = o.precision.dtype();
  options.init_scale = o.precision.loss_scale;
  // ZeRO-Offload: Adam's state and the float32 masters in host memory, AdamW on the CPU (--offload).
  options.offload = offload_of(o);
  parallel::ZeroOptimizer zero(*model, group, options);
  parallel::DistributedSampler sampler(task.size, group, o.common.seed);
  const std::int64_t local_batch = global_batch / ranks;
  std::optional<checkpoint::ShardedFolder> folder;
  if (plan.checkpointed && !o.checkpoints.dir.empty()) folder.emplace(o.checkpoints.dir, o.checkpoints.keep);
  if (folder && o.checkpoints.resume) run.first_step = resume(o, *folder, group, zero, settings(o, stage, task, global_batch));
  std::unique_ptr<ZeroCheck> check;
  if (plan.verified)
    check = std::make_unique<ZeroCheck>(task, zero, options, sampler, group, o.common.seed, global_batch, o.accum,
                                        run.first_step);
  reset_peak_memory(device);
  double total_ms = 0;
  for (std::int64_t step = run.first_step; step < o.training.steps; ++step) {
    if (plan.checkpointed) o.kill.at_step_start(step, group.rank());  // a node lost, when asked
    const auto begin = Clock::now();
    double checking_ms = 0;  // the verification's own work, left out of the step time
    auto checking = [&](auto&& work) {
      const auto t = Clock::now();
      work();
      checking_ms += std::chrono::duration<double, std::milli>(Clock::now() - t).count();
    };
    if (check) checking([&] { check->begin_step(step); });
    const auto share = sampler.batch(step, local_batch);
    // --fault skip-rank-share: the last rank's share of the step is lost (its loss weighted 0), as a
    // reduction that forgot one rank would.
    const bool lose_my_share = o.faults.at("skip-rank-share", step) && group.rank() == ranks - 1;
    double local_loss = 0;
    for (const auto& batch : data::split_batches(share, (local_batch + o.accum - 1) / o.accum)) {
      const float weight = lose_my_share ? 0.0f : static_cast<float>(batch.size()) / static_cast<float>(share.size());
      Tensor loss;
      {
        Autocast autocast(zero.precision());  // fp32: off
        loss = scale(task.loss(*model, batch), weight);
      }
      local_loss += loss.item();
      // fp16: backward from the loss times the loss scale. Stages 2 and 3 reduce-scatter each unit's
      // gradients as soon as they are complete.
      zero.scale_loss(loss).backward();
    }
    zero.reduce_gradients();  // stage 0 all-reduces; stages 1-3 reduce-scatter, each rank keeping its part
    const float loss = comm::all_reduce_scalar(group, static_cast<float>(local_loss), comm::ReduceOp::average);
    if (check) checking([&] { check->check_gradient(step, loss); });
    const double norm = zero.apply();  // clip, AdamW on this rank's part (skipped by fp16 on overflow), all-gather
    if (check) checking([&] { check->check_update(step, norm); });
    zero.zero_grad();
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - begin).count() - checking_ms;
    if (step > 0 || o.training.steps == 1) total_ms += ms;
    run.losses.push_back(loss);
    if (run.ring_bytes == 0 && std::isfinite(norm)) {  // a step taken whole
      run.ring_bytes = zero.ring_bytes_last_step();
      run.host_traffic = zero.host_traffic_last_step();
    }
    if (!o.compare && (step % o.log_every == 0 || step + 1 == o.training.steps))
      log("step %4lld  loss %.6f  %.2f ms\n", static_cast<long long>(step), run.losses.back(), ms);
    if (folder && checkpoint::writes_checkpoint_at(step + 1, o.training.steps, o.checkpoints.every))
      save(o, *folder, group, zero, *model, step + 1, settings(o, stage, task, global_batch));
  }
  // What the run measured, against the formulas (report.cpp).
  run.step_ms = total_ms / static_cast<double>(std::max<std::int64_t>(1, o.training.steps - run.first_step - 1));
  run.precision = zero.precision();
  run.skipped_steps = zero.scaler().skipped_steps();
  const MemoryStats after = memory_stats(device), host_after = memory_stats(Device::cpu);
  run.offload = options.offload;
  run.parameters = zero.full_parameters();
  if (check) run.check = check->finish(run.parameters);
  if (plan.checkpointed && !o.save.empty()) save_gathered(o, run, *model, group);
  measure(run, {before, after}, {host_before, host_after}, ranks, o.sim_network, metrics);
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
  if (!o.checkpoints.dir.empty()) {
    const checkpoint::ShardedFolder folder(o.checkpoints.dir, o.checkpoints.keep);
    checkpoint::prepare_checkpoint_folder(
        group, o.checkpoints.dir, o.checkpoints.resume, [&] { return folder.remove_incomplete(); },
        [&] { return folder.has_checkpoints(); },
        [&] {
          return folder.obstruction([&](std::int64_t step) {
            return checkpoint::writes_checkpoint_at(step, o.training.steps, o.checkpoints.every);
          });
        });
  }
  bool passed = true;
  std::vector<StageRun> runs;
  if (o.compare) {
    // Every stage, checked in lock-step; with --prefetch, stage 3 twice, gathering on demand and ahead.
    for (int stage = 0; stage <= 3; ++stage) runs.push_back(train(o, {stage, false, false, true}, task, global_batch, group, device, session.metrics));
    if (o.prefetch) runs.push_back(train(o, {3, true, false, true}, task, global_batch, group, device, session.metrics));
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
    print_memory_table(runs, ranks, network);
    log("final parameter checksum %016llx (step %lld)\n", static_cast<unsigned long long>(runs[0].checksum),
        static_cast<long long>(o.training.steps));
    if (o.verify) passed = report_check(runs[0]);
  }
  log("%s\n", passed ? "PASSED" : "FAILED");
  return passed ? 0 : 1;
}

// What a run's checkpoints must match to be resumed: every setting that decides a step.
checkpoint::Metadata settings(const Options& o, int stage, const nn::TrainingTask& task, std::int64_t global_batch) {
  auto text = [](double v) {
    char b[32];
    std::snprintf(b, sizeof b, "%.9g", v);
    return std::string(b);
  };
  return {{"stage", std::to_string(stage)},        {"model", task.description},
          {"seed", std::to_string(o.common.seed)}, {"global-batch", std::to_string(global_batch)},
          {"accum", std::to_string(o.accum)},      {"lr", text(o.training.lr)},
          {"clip", text(o.clip)},                  {"precision", o.precision.precision}};
  // --offload is left out: where the state lives changes no bit of it, so a run may resume either way.
}

std::int64_t resume(const Options& o, const checkpoint::ShardedFolder& folder, comm::Communicator& group,
                    parallel::ZeroOptimizer& zero, const checkpoint::Metadata& settings) {
  const std::int64_t step = parallel::resume_zero_checkpoint(folder, group, zero, settings);
  log("resumed from step %lld (%s, %d shards)\n", static_cast<long long>(step), folder.step_dir(step).c_str(),
      zero.layout().shards());
  if (step > o.training.steps)
    throw UsageError("--steps: " + std::to_string(o.training.steps) + " is fewer than the checkpoint's " +
                     std::to_string(step));
  checkpoint::remove_dead_writes(group, [&] { return folder.remove_incomplete(); });  // resumed: now they may go
  return step;
}

// Every rank writes its shard of step `step`, and rank 0 the index (common/parallel/zero_checkpoint.h).
void save(const Options& o, const checkpoint::ShardedFolder& folder, comm::Communicator& group,
          parallel::ZeroOptimizer& zero, const nn::Module& model, std::int64_t step, const checkpoint::Metadata& settings) {
  const auto begin = Clock::now();
  const std::size_t bytes =
      parallel::save_zero_checkpoint(folder, group, zero, model, step, settings, o.kill.during_save_of(step, group.rank()));
  log("checkpoint of step %lld: %s, %s from this rank in %.1f ms\n", static_cast<long long>(step),
      folder.step_dir(step).c_str(), format_bytes(static_cast<std::int64_t>(bytes)).c_str(),
      std::chrono::duration<double, std::milli>(Clock::now() - begin).count());
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
