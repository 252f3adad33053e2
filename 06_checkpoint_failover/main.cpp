// Chapter 06: checkpoints and failover. Data-parallel training (chapter 04's MLP or GPT, chapter 05's
// buckets) with Adam (AdamW with its schedule for the GPT), saving a checkpoint every --ckpt-every steps: the parameters, Adam's moments and
// where training stands (step, global sample position, world size). A job that dies resumes from the
// newest good checkpoint and, because everything that decides the next step was saved, continues to
// exactly the result it would have reached without the failure: bit for bit at the same world size.
// scripts/failover.py restarts the job after a failure, as torchrun --max-restarts does. With --verify
// every step of the run, from the one it starts or resumes at, is checked in lock-step against one
// rank that read the same checkpoint itself.
#include <chrono>
#include <csignal>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <sstream>

#include "common/checkpoint/folder.h"          // step_N.safetensors, `latest`, --keep
#include "common/checkpoint/parameters.h"      // --save: the final parameters as safetensors
#include "common/checkpoint/resume.h"          // rank 0 reads, validates and broadcasts
#include "common/checkpoint/training_state.h"  // what a checkpoint holds, and the checks before loading
#include "common/cli/cli.h"                    // common flags, validators, exit codes
#include "common/cli/kill_options.h"           // --fail-at-step: a rank killed on purpose
#include "common/cli/session.h"                // device, topology and metrics, set up once
#include "common/comm/environment.h"           // MPI start-up
#include "common/core/log.h"                   // rank 0 prints
#include "common/cli/model_options.h"          // --model mlp|gpt and the GPT's sizes
#include "common/data/sampling.h"              // SampleStream: a data order that survives a change of world size
#include "common/nn/tasks.h"                   // the MLP's and the GPT's task
#include "common/ops/ops.h"                    // scale
#include "common/optim/recipe.h"               // Adam; AdamW with warm-up, cosine decay and clipping
#include "common/parallel/ddp.h"               // DistributedDataParallel
#include "common/parallel/distributed_sampler.h" // share_of: each rank's part of the global batch
#include "common/parallel/replicas.h"          // checksums, on_rank0
#include "common/verify/compare.h"             // max_abs_diff
#include "common/verify/lockstep.h"            // the step-by-step check against one rank

using namespace course;

namespace {

struct Options {
  cli::CommonOptions common;
  cli::DistributedOptions distributed;
  std::string ckpt_dir;
  std::int64_t ckpt_every = 20;
  int keep = 3;
  bool resume = false;
  std::int64_t steps = 200;
  std::int64_t global_batch = 240;  // divisible by 1, 2, 3, 4, 5, 6 and 8 ranks
  float lr = 1e-3f;
  std::int64_t samples = 8192;
  std::int64_t features = 16;
  std::int64_t hidden = 256;
  int layers = 2;
  int log_every = 20;
  cli::KillOptions kill;  // --fail-at-step, --fail-rank, --fail-during-save
  bool verify = false;
  cli::FaultOptions faults;        // --fault, --fault-from-step
  bool fault_step_given = false;   // without --fault-from-step the fault breaks the resume itself
  std::string save;
  double mtbf_hours = 24;
  cli::ModelOptions models;  // --model mlp|gpt, the GPT's sizes, --data
  bool samples_given = false;
};

constexpr std::int64_t kMaxSteps = 10'000'000;

nn::TrainingTask make_task(const Options& o, Device device) {
  if (!o.models.data.empty() && o.models.model != "gpt") throw UsageError("--data: a text file is for --model gpt");
  if (o.models.model == "mlp") return nn::mlp_task(o.samples, o.features, o.hidden, o.layers, device, o.common.seed);
  return cli::gpt_training_task(o.models, o.samples, o.samples_given, device, o.common.seed);
}

// The MLP trains with Adam at a constant rate; the GPT as GPT-2 did (optim::Recipe "adamw"), whose
// rate follows a schedule over --steps.
std::string recipe_of(const Options& o) { return o.models.model == "gpt" ? "adamw" : "adam"; }

// What a checkpoint must match to be loaded into this run: the model's configuration and the data it
// trains on, and for the GPT the length of the schedule (a rate schedule over other --steps would make
// the rest of the run another run).
std::string model_config(const Options& o, const nn::TrainingTask& task, const nn::Module& model) {
  std::ostringstream s;
  if (o.models.model == "mlp") {
    s << R"({"model":"mlp","features":)" << o.features << R"(,"hidden":)" << o.hidden << R"(,"layers":)" << o.layers
      << R"(,"outputs":1,"activation":"relu")";
  } else {
    s << R"({"model":"gpt","gpt":)" << dynamic_cast<const nn::GPT&>(model).config().to_json()
      << R"(,"schedule_steps":)" << o.steps;
  }
  s << R"(,"data":")" << task.description << R"("})";
  return s.str();
}

// One training run's state: the model under DDP and its optimizer. Each rank initialises with its own
// seed; DDP's broadcast makes them identical (chapter 04).
struct Trainer {
  std::shared_ptr<nn::Module> model;
  std::unique_ptr<parallel::DistributedDataParallel> ddp;
  std::unique_ptr<optim::Recipe> recipe;

  Trainer(const Options& o, const nn::TrainingTask& task, comm::Communicator& group) {
    model = task.make_model(o.common.seed + static_cast<std::uint64_t>(group.rank()));
    ddp = std::make_unique<parallel::DistributedDataParallel>(model, group);
    reset_optimizer(o);
  }
  // --fault lose-optimizer-state: Adam's moments are zeroed and its step count kept, as a restore that
  // forgot them would leave them (the checkpoints it writes then stay consistent, and load).
  void lose_optimizer_moments() {
    for (auto& [name, t] : recipe->optimizer().state()) {
      Tensor moment = t;
      moment.fill_(0.0f);
    }
  }
  // A fresh optimizer: no moments, no steps taken.
  void reset_optimizer(const Options& o) {
    recipe = std::make_unique<optim::Recipe>(recipe_of(o), model->parameters(), o.lr, o.steps);
  }
  optim::Optimizer& optimizer() { return recipe->optimizer(); }

  // Step `step` on the global batch at `position` of the sample stream; this rank takes its share.
  // With `check` (--verify), in lock-step against one rank.
  float step(const nn::TrainingTask& task, const data::SampleStream& stream, std::int64_t step, std::int64_t position,
             std::int64_t global_batch, comm::Communicator& group, verify::Lockstep* check = nullptr) {
    if (check) check->begin_step(step, *model);
    auto share = parallel::DistributedSampler::share_of(stream.take(position, global_batch), group.rank(), group.size());
    Tensor loss = task.loss(*model, share);
    loss.backward();  // DDP averages the gradients across ranks
    Tensor global = Tensor::from_host({loss.item()}, {1});
    group.all_reduce(global, comm::ReduceOp::average);
    if (check) check_against_one_rank(*check, task, stream, step, global_batch, group, *model, global.item());
    const double norm = recipe->step(step);
    if (check) check->check_update(step, norm);
    return global.item();
  }

  // The step's averaged gradient against one rank's: every rank's share of the global batch that step
  // `step` must train on (at position step x global_batch, whatever the run's own bookkeeping says),
  // recomputed as that rank computed it.
  static void check_against_one_rank(verify::Lockstep& check, const nn::TrainingTask& task,
                                     const data::SampleStream& stream, std::int64_t step, std::int64_t global_batch,
                                     comm::Communicator& group, const nn::Module& model, float loss) {
    const auto global = stream.take(step * global_batch, global_batch);
    const int ranks = group.size();
    check.check_parts(step, model, loss, static_cast<std::size_t>(ranks), 1.0 / ranks,
                      [&](nn::Module& reference, std::size_t r) {
                        Tensor l = task.loss(reference, parallel::DistributedSampler::share_of(global, static_cast<int>(r), ranks));
                        l.backward();
                        return l.item();
                      });
  }

  std::vector<float> optimizer_state_to_host() const {
    std::vector<float> all;
    for (const auto& [name, t] : recipe->optimizer().state()) {
      auto v = t.to_host();
      all.insert(all.end(), v.begin(), v.end());
    }
    return all;
  }
};

int run(const Options& o, cli::Session& session) {
  comm::Communicator& group = session.topology->dp_group();
  const Device device = session.device;
  const int ranks = group.size();
  if (o.global_batch % ranks != 0)
    throw UsageError("--global-batch: " + std::to_string(o.global_batch) + " is not divisible by the " +
                     std::to_string(ranks) + " ranks");
  cli::check_kill_options(o.kill, o.steps, o.ckpt_every, ranks, /*only_rank0_writes=*/true);

  const nn::TrainingTask task = make_task(o, device);  // the same data on every rank
  data::SampleStream stream(task.size, o.common.seed);
  Trainer trainer(o, task, group);
  const std::string config = model_config(o, task, *trainer.model);
  checkpoint::CheckpointFolder folder(o.ckpt_dir, o.keep);
  log("checkpoint failover: %d ranks, %s, %s lr %g, %lld steps of %lld samples; checkpoint every %lld "
      "steps into %s (keeping %d)%s\n",
      ranks, task.description.c_str(), trainer.optimizer().name().c_str(), o.lr, static_cast<long long>(o.steps),
      static_cast<long long>(o.global_batch), static_cast<long long>(o.ckpt_every), o.ckpt_dir.c_str(), o.keep,
      cli::KillOptions::restart_count() ? (", restart " + std::to_string(cli::KillOptions::restart_count())).c_str() : "");

  // --verify: one rank's model and optimizer beside the run, starting where the run starts (the same
  // initialisation, or the checkpoint resumed, restored into it on its own).
  std::shared_ptr<nn::Module> reference;
  std::unique_ptr<optim::Recipe> reference_recipe;
  if (o.verify) {
    reference = verify::make_reference([&] { return task.make_model(o.common.seed); });
    reference_recipe = std::make_unique<optim::Recipe>(recipe_of(o), reference->parameters(), o.lr, o.steps);
  }

  // ---- where to start: fresh, or from the newest good checkpoint -------------------------------------
  checkpoint::TrainingState state;
  state.seed = o.common.seed;
  state.global_batch = o.global_batch;
  std::string resumed_from;
  int rejected = 0;
  checkpoint::prepare_checkpoint_folder(
      group, o.ckpt_dir, o.resume, [&] { return folder.remove_partial_writes(); }, [&] { return folder.has_checkpoints(); });
  if (!o.resume) {
    state.world_history = std::to_string(ranks) + "@0";
  } else {
    std::string why;
    auto found = checkpoint::load_latest_good(
        group, folder,
        [&](const std::string& path, const checkpoint::Loaded& loaded) {
          checkpoint::check_training_checkpoint(path, loaded, *trainer.model, config, trainer.optimizer());
        },
        [&](const std::string& line) {
          ++rejected;
          log("rejected %s\n", line.c_str());
        },
        &why);
    if (!found) throw UsageError("--resume: " + why);
    state = checkpoint::check_training_checkpoint(found->path, found->loaded, *trainer.model, config, trainer.optimizer());
    if (state.global_batch != o.global_batch)
      throw UsageError("--global-batch: " + std::to_string(o.global_batch) + " differs from the checkpoint's " +
                       std::to_string(state.global_batch) + "; the steps would no longer be the same steps");
    if (state.seed != o.common.seed)
      throw UsageError("--seed: " + std::to_string(o.common.seed) + " differs from the checkpoint's " +
                       std::to_string(state.seed) + "; the data order would not continue");
    if (state.step > o.steps)
      throw UsageError("--steps: " + std::to_string(o.steps) + " is fewer than the checkpoint's " +
                       std::to_string(state.step));
    checkpoint::restore(found->loaded, *trainer.model, trainer.optimizer());
    if (reference) {
      MemoryCategoryOverride verification(MemoryCategory::verification);
      checkpoint::restore(found->loaded, *reference, reference_recipe->optimizer());
    }
    if (state.world_size != ranks) state.world_history += " " + std::to_string(ranks) + "@" + std::to_string(state.step);
    resumed_from = found->path;
    log("resumed from step %lld (%s, saved at %d ranks; sample position %lld, epoch %lld)\n",
        static_cast<long long>(state.step), found->path.c_str(), state.world_size,
        static_cast<long long>(state.samples_seen), static_cast<long long>(state.epoch));
    session.metrics.write({{"event", "resume"}, {"step", state.step}, {"path", found->path},
                           {"saved_world_size", state.world_size}, {"world_size", ranks}, {"rejected", rejected}});
  }
  const std::int64_t start_step = state.step;
  state.world_size = ranks;
  // --fault breaks the resume itself, or with --fault-from-step K the run at step K: the optimizer's
  // state is lost, or the data goes back one batch.
  const std::int64_t fault_step = o.fault_step_given ? o.faults.from_step : (o.resume ? start_step : -1);
  std::unique_ptr<verify::Lockstep> lockstep;
  if (reference)
    lockstep = std::make_unique<verify::Lockstep>(
        reference, [&](std::int64_t s) { reference_recipe->update(s); }, &group, reference_recipe->clip());
  if (o.kill.armed()) log("fault injection: %s\n", o.kill.describe().c_str());

  // ---- training, with a checkpoint every --ckpt-every steps and at the end ---------------------------
  double write_ms = 0, written_mb = 0;
  int checkpoints = 0;
  bool diverged = false;
  double step_ms = 0;
  std::int64_t timed_steps = 0;
  for (std::int64_t step = start_step; step < o.steps; ++step) {
    o.kill.at_step_start(step, group.rank());  // a node lost mid-training, when asked
    if (step == fault_step && o.faults.fault == "lose-optimizer-state") trainer.lose_optimizer_moments();
    if (step == fault_step && o.faults.fault == "repeat-batch") state.samples_seen -= o.global_batch;
    const auto step_begin = std::chrono::steady_clock::now();
    const float loss = trainer.step(task, stream, step, state.samples_seen, o.global_batch, group, lockstep.get());
    if (step > start_step) {  // the first step warms up allocators and caches
      step_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - step_begin).count();
      ++timed_steps;
    }
    state.samples_seen += o.global_batch;
    state.step = step + 1;
    state.epoch = stream.epoch_of(state.samples_seen);
    if (!std::isfinite(loss)) {  // nothing diverged is ever saved: the last checkpoint stays the newest
      log("step %4lld  loss %g: training diverged; lower the learning rate (--lr %g)\n", static_cast<long long>(step),
          loss, o.lr);
      diverged = true;
      break;
    }
    if (step % o.log_every == 0 || step + 1 == o.steps) {
      log("step %4lld  loss %.6f\n", static_cast<long long>(step), loss);
      session.metrics.write({{"event", "step"}, {"step", step}, {"loss", loss}});
    }
    if (state.step % o.ckpt_every != 0 && state.step != o.steps) continue;
    parallel::on_rank0(group, [&] {  // the ranks hold the same state: one writer, one copy
      const checkpoint::WriteProgress die_halfway = o.kill.during_save_of(state.step, group.rank());
      const auto begin = std::chrono::steady_clock::now();
      // What the loader would reject is never written: with --keep it would replace the good ones.
      checkpoint::Loaded outgoing;
      outgoing.tensors = checkpoint::training_tensors(*trainer.model, trainer.optimizer());
      outgoing.metadata = checkpoint::training_metadata(state, config, trainer.optimizer());
      outgoing.checksummed = true;  // the file will carry one
      checkpoint::check_training_checkpoint(folder.path_for(state.step), outgoing, *trainer.model, config,
                                            trainer.optimizer());
      const std::size_t bytes = folder.save(state.step, outgoing.tensors, outgoing.metadata, die_halfway);
      const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - begin).count();
      write_ms += ms;
      written_mb += static_cast<double>(bytes) / 1e6;
      ++checkpoints;
      log("checkpoint of step %lld: %s, %.2f MB in %.1f ms (%.0f MB/s)\n", static_cast<long long>(state.step),
          folder.path_for(state.step).c_str(), static_cast<double>(bytes) / 1e6, ms,
          static_cast<double>(bytes) / 1e3 / std::max(ms, 1e-3));
      session.metrics.write({{"event", "checkpoint"}, {"step", state.step}, {"bytes", bytes}, {"write_ms", ms}});
    });
  }

  // ---- how often to checkpoint: Young's approximation ------------------------------------------------
  // J. W. Young, "A first order approximation to the optimum checkpoint interval" (CACM 1974): with a
  // checkpoint costing C seconds and a mean time between failures M, lose the least time by writing
  // one every sqrt(2 C M) seconds. Rank 0 measured C; every rank measured its step time.
  if (checkpoints > 0 && timed_steps > 0) {
    const double cost_s = write_ms / checkpoints / 1000.0, mtbf_s = o.mtbf_hours * 3600.0;
    const double interval_s = std::sqrt(2.0 * cost_s * mtbf_s);
    const double per_step_s = step_ms / static_cast<double>(timed_steps) / 1000.0;
    log("how often to checkpoint (Young 1974): sqrt(2 x checkpoint cost %.1f ms x MTBF %g h) = %.1f s, about every "
        "%.0f steps of %.2f ms\n", 1000 * cost_s, o.mtbf_hours, interval_s, interval_s / per_step_s, 1000 * per_step_s);
    session.metrics.write({{"event", "young"}, {"checkpoint_ms", 1000 * cost_s}, {"mtbf_hours", o.mtbf_hours},
                           {"interval_s", interval_s}, {"step_ms", 1000 * per_step_s},
                           {"interval_steps", interval_s / per_step_s}});
  }

  // ---- the result: checksums, and with --verify the uninterrupted run ---------------------------------
  const bool identical = trainer.ddp->parameters_identical();
  const std::uint64_t checksum = parallel::parameter_checksum(trainer.model->parameters());
  std::vector<Tensor> moments;
  for (const auto& [name, t] : trainer.optimizer().state()) moments.push_back(t);
  const std::uint64_t optimizer_checksum = parallel::parameter_checksum(moments);
  log("final parameter checksum %016llx, optimizer state checksum %016llx (step %lld); ranks identical: %s\n",
      static_cast<unsigned long long>(checksum), static_cast<unsigned long long>(optimizer_checksum),
      static_cast<long long>(state.step), identical ? "yes" : "NO");
  const bool same_world = state.world_history.find(' ') == std::string::npos;
  double difference = 0, optimizer_difference = 0;
  verify::LockstepSummary check;
  bool passed = identical && !diverged;
  if (lockstep && !diverged) {
    check = lockstep->finish(*trainer.model);
    if (check.passed)
      log("verify: steps %lld-%lld in lock-step against one rank (started from %s): every averaged gradient within its "
          "float32 bound (%.3g of it), every update the optimizer's, bit for bit\n",
          static_cast<long long>(start_step), static_cast<long long>(state.step) - 1,
          resumed_from.empty() ? "the same initialisation" : "the checkpoint, restored on its own",
          check.worst_gradient_ratio);
    else
      log("verify: lock-step FAILED at step %lld: %s\n", static_cast<long long>(check.first_failed_step),
          check.first_failure.c_str());
    passed = passed && check.passed;
    if (same_world) {
      // And the run without interruption, at this world size, in this job: the same seeds, the same data.
      Trainer uninterrupted(o, task, group);
      for (std::int64_t step = 0; step < o.steps; ++step)
        uninterrupted.step(task, stream, step, step * o.global_batch, o.global_batch, group);
      difference = verify::max_abs_diff(trainer.model->parameters_to_host(), uninterrupted.model->parameters_to_host());
      optimizer_difference =
          verify::max_abs_diff(trainer.optimizer_state_to_host(), uninterrupted.optimizer_state_to_host());
      const bool bit_identical = checksum == parallel::parameter_checksum(uninterrupted.model->parameters()) &&
                                 difference == 0 && optimizer_difference == 0 &&
                                 trainer.optimizer().steps_taken() == uninterrupted.optimizer().steps_taken();
      log("verify: against the uninterrupted run at %d ranks: parameters and optimizer state %s (largest differences "
          "%.3g and %.3g)\n", ranks, bit_identical ? "bit-identical" : "DIFFER", difference, optimizer_difference);
      passed = passed && bit_identical;
    } else {
      log("verify: world sizes %s: bit for bit applies at an unchanged world size only; the steps since the change "
          "are the ones checked in lock-step above\n", state.world_history.c_str());
    }
  }
  if (!diverged) cli::report_evaluation(task, *trainer.model, group, session.metrics);
  if (!o.save.empty())
    parallel::on_rank0(group, [&] {
      checkpoint::save_parameters(o.save, *trainer.model, {{"chapter", "06_checkpoint_failover"},
                                                           {"steps", std::to_string(state.step)}});
      log("parameters saved to %s\n", o.save.c_str());
    });
  session.metrics.write({{"event", "failover_summary"}, {"ranks", ranks}, {"steps", state.step},
                         {"start_step", start_step}, {"resumed_from", resumed_from}, {"rejected", rejected},
                         {"restart_count", cli::KillOptions::restart_count()}, {"world_history", state.world_history},
                         {"checksum", checksum}, {"optimizer_checksum", optimizer_checksum},
                         {"identical", identical}, {"checkpoints", checkpoints},
                         {"write_mb_per_s", write_ms > 0 ? written_mb / (write_ms / 1000.0) : 0.0},
                         {"verified", o.verify}, {"same_world", same_world}, {"max_diff", difference},
                         {"optimizer_max_diff", optimizer_difference}, {"lockstep_passed", check.passed},
                         {"first_failed_step", check.first_failed_step}, {"gradient_bound_ratio", check.worst_gradient_ratio},
                         {"fault", o.faults.fault}, {"fault_step", fault_step}, {"diverged", diverged}, {"passed", passed}});
  log("%s\n", passed ? "PASSED" : "FAILED");
  return passed ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  comm::Environment env(argc, argv);
  CLI::App app{"Chapter 06: checkpoints, exact resume, and surviving a dead rank"};
  Options o;
  cli::add_common_options(app, o.common);
  cli::add_distributed_options(app, o.distributed);
  cli::add_save_option(app, o.save);
  cli::add_model_options(app, o.models);
  app.add_option("--ckpt-dir", o.ckpt_dir, "Folder of the checkpoints (rank 0 writes it)")
      ->required();
  app.add_option("--ckpt-every", o.ckpt_every, "Write a checkpoint every N steps (and at the end)")
      ->check(cli::PositiveInteger & CLI::Range(std::int64_t{1}, kMaxSteps))->capture_default_str();
  app.add_option("--keep", o.keep, "Keep the newest K checkpoints")->check(cli::PositiveInteger & CLI::Range(1, 1000))
      ->capture_default_str();
  app.add_flag("--resume", o.resume, "Continue from the newest good checkpoint in --ckpt-dir");
  app.add_option("--steps", o.steps, "Optimizer steps in all")
      ->check(cli::PositiveInteger & CLI::Range(std::int64_t{1}, kMaxSteps))->capture_default_str();
  app.add_option("--global-batch", o.global_batch, "Samples per optimizer step, over all ranks")
      ->check(cli::PositiveInteger & CLI::Range(std::int64_t{1}, std::int64_t{1} << 24))->capture_default_str();
  app.add_option("--lr", o.lr, "Learning rate (Adam's; for the GPT, AdamW's peak)")->check(cli::PositiveFinite)->capture_default_str();
  app.add_option("--samples", o.samples, "Dataset size (for the GPT: training problems)")
      ->check(cli::PositiveInteger & CLI::Range(std::int64_t{1}, std::int64_t{1} << 24))->capture_default_str();
  app.add_option("--features", o.features, "Input features")->check(CLI::Range(2, 1 << 16))->capture_default_str();
  app.add_option("--hidden", o.hidden, "Hidden width")->check(CLI::Range(1, 1 << 14))->capture_default_str();
  app.add_option("--layers", o.layers, "Hidden layers")->check(CLI::Range(1, 64))->capture_default_str();
  app.add_option("--log-every", o.log_every, "Print the loss every N steps")->check(cli::PositiveInteger)
      ->capture_default_str();
  cli::add_kill_options(app, o.kill, kMaxSteps);
  app.add_option("--mtbf-hours", o.mtbf_hours, "Mean time between failures, for the checkpoint interval it suggests "
                                               "(Young's approximation)")
      ->check(cli::PositiveFinite & CLI::Range(1e-6, 1e6))->capture_default_str();
  app.add_flag("--verify", o.verify, "Check every step in lock-step against one rank, and compare with the "
                                     "uninterrupted run: bit-identical at an unchanged world size");
  cli::add_fault_options(app, o.faults, {{"lose-optimizer-state", "the optimizer's state is lost"},
                                         {"repeat-batch", "the data goes back one batch"}});
  return cli::run(app, argc, argv, [&] {
    // Without --fault-from-step, the fault breaks the resume (the first step of a resumed run).
    o.fault_step_given = app.count("--fault-from-step") > 0;
    cli::check_fault_options(o.faults, o.steps);
    if (o.fault_step_given && o.faults.from_step == 0 && o.faults.fault != "none")
      throw UsageError("--fault-from-step: chapter 06's faults break what a step inherits from the one before (the "
                       "optimizer's state, the place in the data), which step 0 has not; give 1 or more");
    o.samples_given = app.count("--samples") > 0;
    cli::Session session = cli::start_session(o.common, o.distributed);
    return run(o, session);
  });
}
