// Chapter 07: ZeRO. Data parallelism keeps a whole copy of the model states on every rank: 16 bytes per
// parameter with float32 AdamW (4 the parameter, 4 its gradient, 8 Adam's two moments). ZeRO shards
// them: stage 1 the optimizer state, stage 2 the gradients too, stage 3 the parameters too
// (common/parallel/zero.h). The program trains the MLP or the GPT at the chosen stage, prints where
// every byte went beside the paper's formula and the bytes each rank sent beside the theory, and with
// --verify checks every step in lock-step against the whole model on one rank: the averaged gradient
// that the shards add up to, and the update. --compare runs all four stages one after the other, each
// checked so.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <optional>

#include "common/checkpoint/resume.h"            // broadcast_string: rank 0 checks the folder
#include "common/checkpoint/sharded.h"           // consolidate: the shards as one ordinary file
#include "common/cli/cli.h"                      // common flags, validators, exit codes
#include "common/cli/kill_options.h"             // --fail-at-step: a rank killed on purpose
#include "common/cli/model_options.h"            // --model mlp|gpt and the GPT's flags
#include "common/cli/session.h"                  // device, topology and metrics, set up once
#include "common/comm/environment.h"             // MPI start-up
#include "common/comm/simulated_network.h"       // --sim-network: an alpha-beta delay per message
#include "common/core/log.h"                     // rank 0 prints
#include "common/core/memory.h"                  // the per-category counters, the budget
#include "common/metrics/charts.h"               // --compare's charts, through scripts/plot.py
#include "common/nn/tasks.h"                     // the model, its data and its loss
#include "common/ops/ops.h"                      // scale
#include "common/parallel/distributed_sampler.h" // each rank's share of the data
#include "common/parallel/replicas.h"            // checksums, on_rank0
#include "common/parallel/zero.h"                // ZeroOptimizer, stages 0-3
#include "common/parallel/zero_checkpoint.h"     // sharded checkpoints: one file per rank and an index
#include "common/optim/optimizer.h"             // the reference's AdamW
#include "common/verify/lockstep.h"              // the step-by-step check against the whole model

using namespace course;
using Clock = std::chrono::steady_clock;

namespace {

struct Options {
  cli::CommonOptions common;
  cli::DistributedOptions distributed;
  cli::ModelOptions models;
  int stage = 3;
  std::int64_t steps = 20;
  std::int64_t global_batch = 240;
  int accum = 1;
  float lr = 1e-3f;
  double clip = 1.0;
  std::int64_t hidden = 256;  // the MLP: 8 layers of 256, so that model states dominate and units are small
  int layers = 8;
  int log_every = 5;
  bool verify = false, compare = false, prefetch = false;
  double mem_limit_mb = 0;
  cli::FaultOptions faults;      // --fault, --fault-from-step
  cli::KillOptions kill;         // --fail-at-step: a rank killed on purpose, in the checkpointed run
  std::string ckpt_dir;          // sharded checkpoints of the chosen stage's run
  std::int64_t ckpt_every = 10;
  int keep = 2;
  bool resume = false;
  std::string save;              // the final parameters, consolidated into one ordinary file
  std::string consolidate;       // a step folder to consolidate into --save, without training
  std::string sim_network;       // ALPHA_US,GBPS
  std::string charts = "zero";   // --compare draws PREFIX_memory.png and PREFIX_communication.png
  bool no_charts = false;
};

// One run of a stage: which, and what applies to it.
struct RunPlan {
  int stage = 0;
  bool prefetch = false;      // stage 3 gathers the next unit ahead
  bool checkpointed = false;  // --ckpt-dir, --resume and --save apply to this run
  bool verified = false;      // checked in lock-step against the whole model
};

struct StageRun {
  int stage = 0;
  bool prefetch = false;        // stage 3 gathered the next unit ahead
  std::int64_t first_step = 0;  // above 0 when resumed: losses[i] is step first_step + i
  std::vector<float> losses, parameters;
  double psi = 0;
  std::int64_t params_bytes = 0, grads_bytes = 0, adam_bytes = 0;  // model states held after a step
  std::int64_t peak_activations = 0, peak_communication = 0;
  std::int64_t ring_bytes = 0;  // per step, as a ring sends it
  std::uint64_t checksum = 0;   // of the final parameters
  nlohmann::json record;        // the zero_stage metric
  double step_ms = 0;           // without the verification's own work
  verify::LockstepSummary check;
};

// The model states per rank, by the ZeRO paper's formulas for float32 AdamW (bytes).
struct Formula {
  double params, grads, adam;
  double total() const { return params + grads + adam; }
};
Formula formula(int stage, double psi, int n) {
  return {stage <= 2 ? 4 * psi : 4 * psi / n, stage <= 1 ? 4 * psi : 4 * psi / n, stage == 0 ? 8 * psi : 8 * psi / n};
}
double ring_theory(int stage, double psi, int n) { return (stage == 3 ? 3 : 2) * 4 * psi * (n - 1) / n; }

nn::TrainingTask make_task(const Options& o, Device device) {
  if (!o.models.data.empty() && o.models.model != "gpt") throw UsageError("--data: a text file is for --model gpt");
  if (o.models.model == "mlp") return nn::mlp_task(4096, 16, o.hidden, o.layers, device, o.common.seed);
  return cli::gpt_training_task(o.models, 0, false, device, o.common.seed);
}

// What a run's checkpoints must match to be resumed: every setting that decides a step.
checkpoint::Metadata settings(const Options& o, int stage, const nn::TrainingTask& task) {
  auto text = [](double v) {
    char b[32];
    std::snprintf(b, sizeof b, "%.9g", v);
    return std::string(b);
  };
  return {{"stage", std::to_string(stage)},        {"model", task.description},
          {"seed", std::to_string(o.common.seed)}, {"global-batch", std::to_string(o.global_batch)},
          {"accum", std::to_string(o.accum)},      {"lr", text(o.lr)},
          {"clip", text(o.clip)}};
}

// The lock-step reference (verify/lockstep.h): the whole model on every rank, and on rank 0 the AdamW
// that ZeroOptimizer runs on its shards (the same arithmetic, element by element), so that it repeats
// every update. After a resume it starts from the state the run resumed.
struct Reference {
  std::shared_ptr<nn::Module> model;
  std::unique_ptr<optim::Adam> adam;
  std::unique_ptr<verify::Lockstep> check;
};
void start_from_resumed(Reference& reference, parallel::ZeroOptimizer& zero);
// The step's averaged gradient, gathered from the shards, against the whole model's: each rank's
// micro-batches recomputed from the global batch as that rank computed them (Lockstep::check_parts).
void check_against_whole_model(verify::Lockstep& check, const Options& o, const nn::TrainingTask& task,
                               const parallel::DistributedSampler& sampler, parallel::ZeroOptimizer& zero,
                               std::int64_t step, float loss);

// One run at `plan.stage`. The chosen stage's run writes --ckpt-dir's checkpoints and, with --resume,
// starts from the newest.
StageRun train(const Options& o, const RunPlan& plan, const nn::TrainingTask& task, comm::Communicator& group,
               Device device, metrics::MetricsWriter& metrics) {
  const int ranks = group.size(), stage = plan.stage;
  StageRun run;
  run.stage = stage;
  run.prefetch = plan.prefetch && stage == 3;
  const MemoryStats before = memory_stats(device);
  auto model = task.make_model(o.common.seed);
  run.psi = static_cast<double>(model->parameter_count());
  parallel::ZeroOptions options;
  options.stage = stage;
  options.lr = o.lr;
  options.beta2 = 0.95f;
  options.weight_decay = 0.1f;
  options.max_grad_norm = o.clip;
  options.prefetch = plan.prefetch;
  parallel::ZeroOptimizer zero(*model, group, options);
  parallel::DistributedSampler sampler(task.size, group, o.common.seed);
  const std::int64_t local_batch = o.global_batch / ranks;
  const std::optional<checkpoint::ShardedFolder> folder =
      plan.checkpointed && !o.ckpt_dir.empty() ? std::optional<checkpoint::ShardedFolder>(std::in_place, o.ckpt_dir, o.keep)
                                               : std::nullopt;
  if (folder && o.resume) {
    run.first_step = parallel::resume_zero_checkpoint(*folder, group, zero, settings(o, stage, task));
    log("resumed from step %lld (%s, %d shards)\n", static_cast<long long>(run.first_step),
        folder->step_dir(run.first_step).c_str(), zero.layout().shards());
    if (run.first_step > o.steps)
      throw UsageError("--steps: " + std::to_string(o.steps) + " is fewer than the checkpoint's " +
                       std::to_string(run.first_step));
  }
  Reference reference;
  if (plan.verified) {
    reference.model = verify::make_reference([&] { return task.make_model(o.common.seed); });
    reference.adam = std::make_unique<optim::Adam>(optim::weight_decay_groups(reference.model->parameters(), options.weight_decay),
                                                   options.lr, options.beta1, options.beta2, options.eps, true);
    if (run.first_step > 0) start_from_resumed(reference, zero);
    reference.check = std::make_unique<verify::Lockstep>(reference.model, [&](std::int64_t) {
      reference.adam->step();
      reference.adam->zero_grad();
    }, &group, o.clip);
  }
  reset_peak_memory(device);
  double total_ms = 0;
  // ---- the training step ------------------------------------------------------------------------------
  for (std::int64_t step = run.first_step; step < o.steps; ++step) {
    if (plan.checkpointed) o.kill.at_step_start(step, group.rank());  // a node lost, when asked
    const auto begin = Clock::now();
    double checking_ms = 0;  // the verification's own work, left out of the step time
    auto checking = [&](auto&& work) {
      const auto t = Clock::now();
      work();
      checking_ms += std::chrono::duration<double, std::milli>(Clock::now() - t).count();
    };
    if (reference.check) checking([&] { reference.check->begin_step(step, zero.full_parameters()); });
    const auto share = sampler.batch(step, local_batch);
    const auto micro = data::split_batches(share, (local_batch + o.accum - 1) / o.accum);
    // --fault skip-rank-share: the last rank's share of the step is lost (its loss weighted 0), as a
    // reduction that forgot one rank would.
    const bool lose_my_share = o.faults.at("skip-rank-share", step) && group.rank() == ranks - 1;
    double local_loss = 0;
    for (const auto& batch : micro) {
      const float weight = lose_my_share ? 0.0f : static_cast<float>(batch.size()) / static_cast<float>(share.size());
      Tensor loss = scale(task.loss(*model, batch), weight);
      local_loss += loss.item();
      loss.backward();  // stages 2 and 3 reduce-scatter each unit's gradients as soon as they are complete
    }
    zero.reduce_gradients();  // stage 0 all-reduces; stages 1-3 reduce-scatter, each rank keeping its part
    Tensor loss = Tensor::from_host({static_cast<float>(local_loss)}, {1});
    group.all_reduce(loss, comm::ReduceOp::average);
    if (reference.check)
      checking([&] { check_against_whole_model(*reference.check, o, task, sampler, zero, step, loss.item()); });
    const double norm = zero.apply();  // clip, AdamW on this rank's part, all-gather the parameters
    if (reference.check) checking([&] { reference.check->check_update(step, norm); });
    zero.zero_grad();
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - begin).count() - checking_ms;
    if (step > 0 || o.steps == 1) total_ms += ms;
    run.losses.push_back(loss.item());
    if (step == 0) run.ring_bytes = zero.ring_bytes_last_step();
    if (!o.compare && (step % o.log_every == 0 || step + 1 == o.steps))
      log("step %4lld  loss %.6f  %.2f ms\n", static_cast<long long>(step), run.losses.back(), ms);
    if (folder && ((step + 1) % o.ckpt_every == 0 || step + 1 == o.steps)) {
      const auto begin_save = Clock::now();
      const std::size_t bytes =
          parallel::save_zero_checkpoint(*folder, group, zero, *model, step + 1, settings(o, stage, task),
                                         o.kill.during_save_of(step + 1, group.rank()));
      log("checkpoint of step %lld: %s, %s from this rank in %.1f ms\n", static_cast<long long>(step + 1),
          folder->step_dir(step + 1).c_str(), format_bytes(static_cast<std::int64_t>(bytes)).c_str(),
          std::chrono::duration<double, std::milli>(Clock::now() - begin_save).count());
    }
  }
  // ---- end of the training step; what follows reports it --------------------------------------------
  run.step_ms = total_ms / static_cast<double>(std::max<std::int64_t>(1, o.steps - run.first_step - 1));
  const MemoryStats after = memory_stats(device);
  auto held = [&](MemoryCategory c) { return after.current_of(c) - before.current_of(c); };
  run.params_bytes = held(MemoryCategory::parameters);
  run.grads_bytes = held(MemoryCategory::gradients);
  run.adam_bytes = held(MemoryCategory::optimizer_state);
  run.peak_activations = after.peak_of(MemoryCategory::activations) - before.current_of(MemoryCategory::activations);
  run.peak_communication = after.peak_of(MemoryCategory::communication) - before.current_of(MemoryCategory::communication);
  run.parameters = zero.full_parameters();
  if (reference.check) run.check = reference.check->finish(run.parameters);
  if (plan.checkpointed && !o.save.empty())
    parallel::on_rank0(group, [&] {  // every rank holds the gathered parameters: rank 0 writes them
      checkpoint::NamedTensors tensors;
      std::size_t at = 0;
      for (const auto& [name, p] : model->named_parameters()) {
        const auto n = static_cast<std::size_t>(p.numel());
        tensors.emplace_back(name, Tensor::from_host(std::vector<float>(run.parameters.begin() + static_cast<long>(at),
                                                                        run.parameters.begin() + static_cast<long>(at + n)),
                                                     p.shape()));
        at += n;
      }
      checkpoint::save_safetensors(o.save, tensors, {{"chapter", "07_zero"}, {"stage", std::to_string(stage)},
                                                     {"steps", std::to_string(o.steps)}});
      log("parameters saved to %s\n", o.save.c_str());
    });
  const Tensor gathered = Tensor::from_host(run.parameters, {static_cast<std::int64_t>(run.parameters.size())});
  run.checksum = parallel::parameter_checksum({gathered});
  const Formula f = formula(stage, run.psi, ranks);
  run.record = {{"event", "zero_stage"}, {"stage", stage}, {"ranks", ranks}, {"parameters", run.psi},
                 {"params_bytes", run.params_bytes}, {"grads_bytes", run.grads_bytes}, {"adam_bytes", run.adam_bytes},
                 {"formula_params", f.params}, {"formula_grads", f.grads}, {"formula_adam", f.adam},
                 {"peak_activations", run.peak_activations}, {"peak_communication", run.peak_communication},
                 {"ring_bytes", run.ring_bytes}, {"ring_theory", ring_theory(stage, run.psi, ranks)},
                 {"step_ms", run.step_ms}, {"final_loss", run.losses.empty() ? 0.0f : run.losses.back()},
                 {"checksum", run.checksum},
                 {"first_step", run.first_step}, {"prefetch", run.prefetch},
                 {"simulated_network", o.sim_network.empty() ? "" : "simulated " + o.sim_network}};
  metrics.write(run.record);
  return run;
}

void print_memory_table(const std::vector<StageRun>& runs, int ranks, const std::string& network) {
  log("model states per rank (float32 AdamW, %d ranks, %.0f parameters):\n", ranks, runs.front().psi);
  log("  stage  parameters   gradients   Adam state  total       formula     measured/formula  | peak activations  peak comm. buffers\n");
  for (const StageRun& r : runs) {
    const Formula f = formula(r.stage, r.psi, ranks);
    const double total = static_cast<double>(r.params_bytes + r.grads_bytes + r.adam_bytes);
    log("  %d%s %-12s %-11s %-11s %-11s %-11s %.3f             | %-17s %s\n", r.stage, r.prefetch ? "p    " : "     ",
        format_bytes(r.params_bytes).c_str(), format_bytes(r.grads_bytes).c_str(), format_bytes(r.adam_bytes).c_str(),
        format_bytes(static_cast<std::int64_t>(total)).c_str(), format_bytes(static_cast<std::int64_t>(f.total())).c_str(),
        total / f.total(), format_bytes(r.peak_activations).c_str(), format_bytes(r.peak_communication).c_str());
  }
  log("communication per rank per step (as a ring sends it)%s:\n",
      network.empty() ? "" : ("; step times on a simulated network: " + network).c_str());
  for (const StageRun& r : runs) {
    const double theory = ring_theory(r.stage, r.psi, ranks);
    char against[32] = "";
    if (runs.size() > 1) std::snprintf(against, sizeof against, " (%.2fx stage 0's)", r.step_ms / runs.front().step_ms);
    log("  stage %d%s %-11s theory %-11s (%s)  ratio %.3f   step %.2f ms%s\n", r.stage, r.prefetch ? "p" : " ",
        format_bytes(r.ring_bytes).c_str(), format_bytes(static_cast<std::int64_t>(theory)).c_str(),
        r.stage == 3 ? "3 psi" : "2 psi", ranks > 1 ? static_cast<double>(r.ring_bytes) / theory : 1.0, r.step_ms,
        against);
  }
}

// The lock-step verdict of one stage's run, in one line.
bool report_check(const StageRun& run) {
  const verify::LockstepSummary& c = run.check;
  if (c.passed)
    log("verify stage %d%s, %lld steps in lock-step against the whole model: every averaged gradient within its "
        "float32 bound (%.3g of it), every loss (%.3g of its bound), every update AdamW's bit for bit: PASSED\n",
        run.stage, run.prefetch ? " (prefetching)" : "", static_cast<long long>(c.steps), c.worst_gradient_ratio,
        c.worst_loss_ratio);
  else
    log("verify stage %d%s FAILED at step %lld: %s\n", run.stage, run.prefetch ? " (prefetching)" : "",
        static_cast<long long>(c.first_failed_step), c.first_failure.c_str());
  return c.passed;
}

// --consolidate STEP_DIR --save FILE: the shards of a checkpoint as one ordinary safetensors file.
int consolidate(const Options& o) {
  if (o.save.empty()) throw UsageError("--consolidate: needs --save FILE, the file to write");
  try {
    checkpoint::consolidate(o.consolidate, o.save, {{"chapter", "07_zero"}, {"consolidated_from", o.consolidate}});
  } catch (const checkpoint::CheckpointError& e) {
    throw UsageError(std::string("--consolidate: ") + e.what());
  }
  log("consolidated %s into %s\n", o.consolidate.c_str(), o.save.c_str());
  return 0;
}

int run(const Options& o, cli::Session& session) {
  comm::Communicator& world = session.topology->dp_group();
  if (!o.consolidate.empty()) {
    parallel::on_rank0(world, [&] { consolidate(o); });
    return 0;
  }
  std::unique_ptr<comm::Communicator> simulated;
  std::string network, label;  // "alpha 10 us, 1.25 GB/s"; ", simulated network: ..." for the log
  if (!o.sim_network.empty()) {
    const auto model = comm::parse_network(o.sim_network);
    simulated = comm::simulate_network(world.split(0, world.rank()), model);
    network = comm::describe(model);
    label = ", simulated network: " + network;
  }
  comm::Communicator& group = simulated ? *simulated : world;
  const Device device = session.device;
  const int ranks = group.size();
  if (o.global_batch % (static_cast<std::int64_t>(ranks) * o.accum) != 0)
    throw UsageError("--global-batch: " + std::to_string(o.global_batch) + " is not divisible by ranks x --accum (" +
                     std::to_string(ranks) + " x " + std::to_string(o.accum) + ")");
  const nn::TrainingTask task = make_task(o, device);
  if (o.global_batch > task.size)
    throw UsageError("--global-batch: " + std::to_string(o.global_batch) + " is more than the task's " +
                     std::to_string(task.size) + " samples");
  if (o.mem_limit_mb > 0) set_memory_limit(device, static_cast<std::int64_t>(o.mem_limit_mb * 1024 * 1024));
  log("ZeRO: %d ranks, %s, global batch %lld, %lld steps, AdamW lr %g, clip %g%s%s%s\n", ranks,
      task.description.c_str(), static_cast<long long>(o.global_batch), static_cast<long long>(o.steps), o.lr, o.clip,
      o.prefetch ? ", stage 3 prefetching" : "", label.c_str(),
      o.mem_limit_mb > 0 ? (", memory limit " + format_bytes(memory_limit(device)) + " per rank").c_str() : "");
  cli::check_fault_options(o.faults, o.steps);
  if (o.kill.at_step >= 0 && o.ckpt_dir.empty())
    throw UsageError("--fail-at-step: a rank killed on purpose is for a run that recovers from --ckpt-dir");
  cli::check_kill_options(o.kill, o.steps, o.ckpt_every, ranks, /*only_rank0_writes=*/false);
  if (o.kill.armed()) log("fault injection: %s\n", o.kill.describe().c_str());
  if (o.compare && (!o.ckpt_dir.empty() || !o.save.empty()))
    throw UsageError(std::string(o.ckpt_dir.empty() ? "--save" : "--ckpt-dir") +
                     ": checkpoints are of one stage's run; leave out --compare");
  if (!o.ckpt_dir.empty()) {
    const checkpoint::ShardedFolder folder(o.ckpt_dir, o.keep);
    checkpoint::prepare_checkpoint_folder(
        group, o.ckpt_dir, o.resume, [&] { return folder.remove_incomplete(); }, [&] { return folder.has_checkpoints(); });
  }
  bool passed = true;
  std::vector<StageRun> runs;
  if (o.compare) {
    // With --prefetch, stage 3 runs twice, gathering on demand and ahead: the two side by side.
    // Every stage is checked in lock-step; with --prefetch, stage 3 runs twice, gathering on demand and ahead.
    for (int stage = 0; stage <= 3; ++stage) runs.push_back(train(o, {stage, false, false, true}, task, group, device, session.metrics));
    if (o.prefetch) runs.push_back(train(o, {3, true, false, true}, task, group, device, session.metrics));
    print_memory_table(runs, ranks, network);
    for (const StageRun& r : runs) passed = report_check(r) && passed;
    // Free-running, the stages' final parameters differ by their summation orders only: a figure, not a verdict.
    for (std::size_t i = 1; i < runs.size(); ++i)
      log("stage %d%s's final parameters differ from stage 0's by at most %.3g\n", runs[i].stage,
          runs[i].prefetch ? " (prefetching)" : "", verify::max_abs_diff(runs[i].parameters, runs[0].parameters));
    if (!o.no_charts)
      parallel::on_rank0(group, [&] {
        std::vector<nlohmann::json> records;
        for (const StageRun& r : runs) records.push_back(r.record);
        std::string why;
        if (metrics::draw_charts("zero", records, o.charts, &why))
          log("charts: %s_memory.png, %s_communication.png\n", o.charts.c_str(), o.charts.c_str());
        else
          log("charts: not drawn: %s; the numbers are in --metrics for scripts/plot.py zero\n", why.c_str());
      });
  } else {
    log("stage %d\n", o.stage);
    runs.push_back(train(o, {o.stage, o.prefetch, true, o.verify}, task, group, device, session.metrics));
    print_memory_table(runs, ranks, network);
    log("final parameter checksum %016llx (step %lld)\n", static_cast<unsigned long long>(runs[0].checksum),
        static_cast<long long>(o.steps));
    if (o.verify) passed = report_check(runs[0]);
  }
  log("%s\n", passed ? "PASSED" : "FAILED");
  return passed ? 0 : 1;
}

// ---- the lock-step reference's plumbing -----------------------------------------------------------------

void check_against_whole_model(verify::Lockstep& check, const Options& o, const nn::TrainingTask& task,
                               const parallel::DistributedSampler& sampler, parallel::ZeroOptimizer& zero,
                               std::int64_t step, float loss) {
  MemoryCategoryOverride verification(MemoryCategory::verification);  // the gathered copies are the check's
  const int ranks = sampler.num_replicas();
  const std::int64_t local_batch = o.global_batch / ranks;
  const auto global = sampler.global_batch(step, local_batch);
  const auto micro_of = [&](int rank) {
    return data::split_batches(parallel::DistributedSampler::share_of(global, rank, ranks),
                               (local_batch + o.accum - 1) / o.accum);
  };
  const std::size_t per_rank = micro_of(0).size();
  // Part i is micro-batch i / ranks of rank i % ranks, so each rank recomputes its own.
  check.check_parts(step, zero.full_gradients(), loss, per_rank * static_cast<std::size_t>(ranks), 1.0 / ranks,
                    [&](nn::Module& reference, std::size_t i) {
                      const int rank = static_cast<int>(i % static_cast<std::size_t>(ranks));
                      const auto micro = micro_of(rank);
                      const auto& batch = micro[i / static_cast<std::size_t>(ranks)];
                      const auto share = parallel::DistributedSampler::share_of(global, rank, ranks);
                      Tensor l = scale(task.loss(reference, batch),
                                       static_cast<float>(batch.size()) / static_cast<float>(share.size()));
                      l.backward();
                      return l.item();
                    });
}

void start_from_resumed(Reference& reference, parallel::ZeroOptimizer& zero) {
  MemoryCategoryOverride verification(MemoryCategory::verification);
  reference.model->load_parameters_from_host(zero.full_parameters());
  const auto state = zero.full_optimizer_state();
  // The run's moments are in registration order; the reference's AdamW holds its parameters group by group.
  const auto order = reference.model->parameters();
  std::vector<std::pair<std::string, Tensor>> named;
  const auto& params = reference.adam->params();
  for (std::size_t k = 0; k < params.size(); ++k) {
    std::size_t offset = 0;
    for (const Tensor& p : order) {
      if (p.impl() == params[k].impl()) break;
      offset += static_cast<std::size_t>(p.numel());
    }
    const auto n = static_cast<long>(params[k].numel());
    const auto at = static_cast<long>(offset);
    named.emplace_back(std::to_string(k) + ".exp_avg",
                       Tensor::from_host({state.exp_avg.begin() + at, state.exp_avg.begin() + at + n}, params[k].shape(),
                                         params[k].device()));
    named.emplace_back(std::to_string(k) + ".exp_avg_sq",
                       Tensor::from_host({state.exp_avg_sq.begin() + at, state.exp_avg_sq.begin() + at + n},
                                         params[k].shape(), params[k].device()));
  }
  reference.adam->load_state(named, zero.steps_taken());
}

}  // namespace

int main(int argc, char** argv) {
  comm::Environment env(argc, argv);
  CLI::App app{"Chapter 07: ZeRO stages 0-3, memory and communication against the formulas"};
  Options o;
  cli::add_common_options(app, o.common);
  cli::add_distributed_options(app, o.distributed);
  cli::add_model_options(app, o.models);
  app.add_option("--stage", o.stage, "0 (DDP), 1 (optimizer state sharded), 2 (+ gradients), 3 (+ parameters)")
      ->check(CLI::Range(0, 3))->capture_default_str();
  app.add_option("--steps", o.steps, "Optimizer steps")
      ->check(cli::PositiveInteger & CLI::Range(std::int64_t{1}, std::int64_t{1000000}))->capture_default_str();
  app.add_option("--global-batch", o.global_batch, "Samples per optimizer step, over all ranks")
      ->check(cli::PositiveInteger & CLI::Range(std::int64_t{1}, std::int64_t{1} << 20))->capture_default_str();
  app.add_option("--accum", o.accum, "Micro-batches per step on each rank")->check(cli::PositiveInteger)->capture_default_str();
  app.add_option("--lr", o.lr, "AdamW learning rate")->check(cli::PositiveFinite)->capture_default_str();
  app.add_option("--clip", o.clip, "Clip the gradient's global norm to this (0: off)")
      ->check(cli::NonNegativeFinite)->capture_default_str();
  app.add_option("--hidden", o.hidden, "The MLP's width")->check(CLI::Range(1, 1 << 14))->capture_default_str();
  app.add_option("--layers", o.layers, "The MLP's hidden layers")->check(CLI::Range(1, 64))->capture_default_str();
  app.add_option("--log-every", o.log_every, "Print every N steps")->check(cli::PositiveInteger)->capture_default_str();
  app.add_option("--mem-limit-mb", o.mem_limit_mb, "A budget per rank on the counted memory (MiB); 0 is refused")
      ->check(cli::PositiveFinite);
  cli::add_save_option(app, o.save);
  cli::add_sim_network_option(app, o.sim_network);
  app.add_option("--ckpt-dir", o.ckpt_dir, "Write sharded checkpoints here (one file per rank and an index; on "
                                           "storage every rank shares)");
  app.add_option("--ckpt-every", o.ckpt_every, "A checkpoint every N steps (and at the end)")
      ->check(cli::PositiveInteger & CLI::Range(std::int64_t{1}, std::int64_t{1000000}))->capture_default_str();
  app.add_option("--keep", o.keep, "Keep the newest K checkpoints")->check(CLI::Range(1, 1000))->capture_default_str();
  app.add_flag("--resume", o.resume, "Continue from the newest complete checkpoint in --ckpt-dir (same world size "
                                     "and stage)");
  app.add_option("--consolidate", o.consolidate, "Write the checkpoint in this step folder as one ordinary "
                                                 "safetensors file (--save), without training");
  app.add_flag("--prefetch", o.prefetch, "Stage 3: gather the next unit while this one computes");
  app.add_flag("--verify", o.verify, "Check every step in lock-step against the whole model: the averaged gradient, "
                                     "the loss and the update");
  app.add_flag("--compare", o.compare, "Run stages 0, 1, 2 and 3 one after the other and compare them");
  app.add_option("--charts", o.charts, "With --compare: draw PREFIX_memory.png and PREFIX_communication.png (python3 "
                                       "with matplotlib)")
      ->check(cli::OutputFile)->capture_default_str();
  app.add_flag("--no-charts", o.no_charts, "With --compare: draw no charts");
  cli::add_fault_options(app, o.faults, {{"skip-rank-share", "the last rank's share of each step is lost"}});
  cli::add_kill_options(app, o.kill, 1000000);
  return cli::run(app, argc, argv, [&] {
    if (o.resume && o.ckpt_dir.empty()) throw UsageError("--resume: needs --ckpt-dir, the folder to resume from");
    auto session = cli::start_session(o.common, o.distributed);
    return run(o, session);
  });
}
