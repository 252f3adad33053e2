// Chapter 08: when the model does not fit on one device, split it. Tensor parallelism splits every
// layer across the ranks of a TP group (Megatron-LM: attention's heads, the MLP's hidden units, the
// vocabulary; common/parallel/tensor_parallel_gpt.h); pipeline parallelism splits the layers into
// stages that pass micro-batches along (GPipe or 1F1B; common/parallel/pipeline.h); data parallelism
// runs copies of the whole arrangement and averages their gradients over the DP group only. The
// topology (common/parallel/topology.h) owns the TP x PP x DP grid; nothing here computes a rank.
// --verify trains the unsharded GPT on the whole global batch beside it and compares every step's
// loss and every rank's parameters with their part of the reference.
#include <chrono>
#include <cmath>
#include <map>

#include "common/cli/cli.h"                        // common flags, validators, exit codes
#include "common/cli/model_options.h"              // the GPT's sizes and the addition task
#include "common/cli/session.h"                    // device, topology (the grid) and metrics
#include "common/comm/environment.h"               // MPI start-up
#include "common/core/log.h"                       // rank 0 prints
#include "common/ops/ops.h"                        // cross_entropy, narrow
#include "common/optim/lr_scheduler.h"             // warm-up and cosine decay
#include "common/optim/optimizer.h"                // AdamW with GPT-2's decay groups
#include "common/parallel/distributed_sampler.h"   // each DP replica's share of the data
#include "common/parallel/pipeline.h"              // stages and the schedule's executor
#include "common/parallel/tensor_parallel_gpt.h"   // the slices of the GPT's layers, for --verify
#include "common/verify/compare.h"                 // the drift against the noise floor

using namespace course;

namespace {

// How far the split model may end from the unsharded one, in units of the unsharded run's own rounding
// noise (the same run with each batch summed in reverse order), as chapters 02, 04, 06 and 07 judge:
// splitting a layer or a batch reorders sums, nothing more; a wrong slice or a lost gradient is orders
// of magnitude further out. Runs too short for any noise to show are judged by 1e-3 x lr x steps (the
// largest movement AdamW can make, a thousandth of it).
constexpr double kDriftFactor = 100;

struct Options {
  cli::CommonOptions common;
  cli::DistributedOptions distributed;
  cli::ModelOptions models;
  int tp = 1, pp = 1, dp = 0;
  int micro_batches = 4;
  std::string schedule = "1f1b";
  std::int64_t steps = 20;
  std::int64_t global_batch = 48;
  float lr = 3e-3f;
  int log_every = 5;
  bool verify = false;
};

// AdamW as GPT-2 trains (betas 0.9, 0.95; decay on matrices and embeddings only) with warm-up and
// cosine decay. No clipping yet: a global norm over a TP x PP grid sums each rank's part once.
struct Trainer {
  std::unique_ptr<optim::Adam> adam;
  std::shared_ptr<optim::LRScheduler> schedule;
  Trainer(const std::vector<Tensor>& params, const Options& o) {
    adam = std::make_unique<optim::Adam>(optim::weight_decay_groups(params, 0.1f), o.lr, 0.9f, 0.95f, 1e-8f, true);
    const std::int64_t warmup = std::min<std::int64_t>(100, o.steps / 10);
    if (o.steps > warmup) schedule = optim::warmup_cosine(o.lr, warmup, o.steps, o.lr / 10);
  }
  void step(std::int64_t step) {
    if (schedule) adam->set_lr(schedule->lr_at(step));
    adam->step();
    adam->zero_grad();
  }
};

// The unsharded GPT trained on the whole global batch: the reference of --verify. With `reversed`,
// each batch's samples come in reverse order (the noise floor's run).
struct Reference {
  std::vector<float> losses;
  std::map<std::string, Tensor> parameters;
};
Reference train_reference(const Options& o, const nn::GptTask& task, const parallel::DistributedSampler& sampler,
                          std::int64_t local_batch, Device device, bool reversed) {
  nn::GPT model(task.config, device, o.common.seed);
  Trainer trainer(model.parameters(), o);
  Reference r;
  for (std::int64_t step = 0; step < o.steps; ++step) {
    auto samples = sampler.global_batch(step, local_batch);
    if (reversed) std::reverse(samples.begin(), samples.end());
    const auto batch = task.data->batch(samples, device);
    Tensor loss = cross_entropy(model(batch.ids), batch.targets, data::AdditionTask::kIgnore);
    r.losses.push_back(loss.item());
    loss.backward();
    trainer.step(step);
  }
  for (const auto& [name, p] : model.named_parameters()) r.parameters[name] = p;
  return r;
}

// This rank's part of a reference parameter: a stage keeps GPT-2's names, and with TP its slice.
Tensor part_of(const std::string& name, const Reference& reference, parallel::Topology& topology) {
  const Tensor& whole = reference.parameters.at(name);
  if (topology.tp_size() == 1) return whole;
  auto ends_with = [&](const std::string& tail) {
    return name.size() >= tail.size() && name.compare(name.size() - tail.size(), tail.size(), tail) == 0;
  };
  comm::Communicator& tp = topology.tp_group();
  if (name == "transformer.wte.weight" || ends_with("mlp.c_fc.weight") || ends_with("mlp.c_fc.bias"))
    return parallel::shard_of(whole, 0, tp, "reference");
  if (ends_with("attn.c_attn.weight") || ends_with("attn.c_attn.bias")) return parallel::shard_of_qkv(whole, tp);
  if (ends_with("c_proj.weight")) return parallel::shard_of(whole, 1, tp, "reference");
  return whole;
}

double largest_difference(const nn::Module& model, const Reference& reference, parallel::Topology& topology) {
  double worst = 0;
  for (const auto& [name, p] : model.named_parameters()) {
    const auto mine = p.to_host(), theirs = part_of(name, reference, topology).to_host();
    for (std::size_t i = 0; i < mine.size(); ++i)
      worst = std::max(worst, std::fabs(static_cast<double>(mine[i]) - theirs[i]));
  }
  Tensor t = Tensor::from_host({static_cast<float>(worst)}, {1});
  topology.world().all_reduce(t, comm::ReduceOp::max);
  return t.item();
}

int run(const Options& o, cli::Session& session) {
  parallel::Topology& topology = *session.topology;
  const Device device = session.device;
  const int dp = topology.dp_size();
  if (o.global_batch % (static_cast<std::int64_t>(dp) * o.micro_batches) != 0)
    throw UsageError("--global-batch: " + std::to_string(o.global_batch) + " is not divisible by DP x --micro-batches (" +
                     std::to_string(dp) + " x " + std::to_string(o.micro_batches) + ")");
  nn::GptTask task = cli::gpt_addition_task(o.models, 0, false, device, o.common.seed);
  const std::int64_t local_batch = o.global_batch / dp, micro = local_batch / o.micro_batches;

  // The whole model, made alike on every rank from the seed; each rank keeps its part of it: its
  // stage's layers (all of them when --pp is 1), each split across its TP group.
  nn::GPT full(task.config, device, o.common.seed);
  auto stage = std::make_unique<parallel::PipelineStageGPT>(full, topology.pp_group(), &topology.tp_group());
  nn::Module* model = stage.get();
  const auto schedule = parallel::make_schedule(o.schedule, topology.pp_size(), o.micro_batches);
  log("Chapter 08: %s; %s; global batch %lld = DP %d x %d micro-batches of %lld (%s schedule); %lld steps\n",
      topology.describe().c_str(), task.task.description.c_str(), static_cast<long long>(o.global_batch), dp,
      o.micro_batches, static_cast<long long>(micro), o.schedule.c_str(), static_cast<long long>(o.steps));
  if (topology.pp_size() > 1) log("%s", parallel::describe(schedule).c_str());

  parallel::DistributedSampler sampler(task.task.size, topology.dp_group(), o.common.seed);
  Trainer trainer(model->parameters(), o);
  std::vector<float> losses;
  double busy_ms = 0, step_ms = 0;
  std::int64_t peak_activations = 0;
  for (std::int64_t step = 0; step < o.steps; ++step) {
    const auto samples = sampler.batch(step, local_batch);
    std::vector<Tensor> ids, targets;
    for (int i = 0; i < o.micro_batches; ++i) {
      const std::vector<std::int64_t> part(samples.begin() + i * micro, samples.begin() + (i + 1) * micro);
      auto b = task.data->batch(part, device);
      ids.push_back(b.ids);
      targets.push_back(b.targets);
    }
    const auto result = parallel::run_pipeline(*stage, topology.pp_group(), schedule, ids, targets,
                                               data::AdditionTask::kIgnore);
    const float loss = result.loss;
    if (step > 0 || o.steps == 1) {  // the first step warms up allocators
      step_ms += result.step_ms;
      for (const auto& a : result.timeline) busy_ms += a.end_ms - a.begin_ms;
    }
    peak_activations = std::max(peak_activations, result.peak_activation_bytes);
    // Data parallelism on top: the replicas average their gradients over the DP group only.
    if (dp > 1)
      for (const Tensor& p : model->parameters()) {
        Tensor g = p.grad();
        topology.dp_group().all_reduce(g, comm::ReduceOp::average);
      }
    trainer.step(step);
    Tensor global = Tensor::from_host({loss}, {1});
    topology.dp_group().all_reduce(global, comm::ReduceOp::average);
    losses.push_back(global.item());
    if (step % o.log_every == 0 || step + 1 == o.steps) {
      log("step %4lld  loss %.6f\n", static_cast<long long>(step), losses.back());
      session.metrics.write({{"event", "step"}, {"step", step}, {"loss", losses.back()}});
    }
  }

  // The bubble and the activations of each stage, measured (rank 0 prints every stage's).
  if (topology.pp_size() > 1) {
    const int p = topology.pp_size();
    std::vector<float> mine(static_cast<std::size_t>(2 * p), 0.0f);
    if (topology.tp_rank() == 0 && topology.dp_rank() == 0) {
      mine[static_cast<std::size_t>(topology.pp_rank())] = step_ms > 0 ? static_cast<float>(1.0 - busy_ms / step_ms) : 0.0f;
      mine[static_cast<std::size_t>(p + topology.pp_rank())] = static_cast<float>(peak_activations);
    }
    Tensor all = Tensor::from_host(mine, {2 * p});
    topology.world().all_reduce(all, comm::ReduceOp::sum);
    const auto v = all.to_host();
    const double theory = parallel::bubble_fraction(p, o.micro_batches);
    log("pipeline: %d stages, %d micro-batches, %s; bubble (idle share of the step) against (p-1)/(m+p-1) = %.3f:\n",
        p, o.micro_batches, o.schedule.c_str(), theory);
    for (int s = 0; s < p; ++s) {
      log("  stage %d  bubble %.3f  peak activations %s\n", s, v[static_cast<std::size_t>(s)],
          format_bytes(static_cast<std::int64_t>(v[static_cast<std::size_t>(p + s)])).c_str());
      session.metrics.write({{"event", "pipeline_stage"}, {"stage", s}, {"stages", p}, {"micro_batches", o.micro_batches},
                             {"schedule", o.schedule}, {"bubble", v[static_cast<std::size_t>(s)]}, {"theory", theory},
                             {"peak_activation_bytes", v[static_cast<std::size_t>(p + s)]}});
    }
  }

  bool passed = true;
  if (o.verify) {
    const Reference reference = train_reference(o, task, sampler, local_batch, device, false);
    const Reference reordered = train_reference(o, task, sampler, local_batch, device, true);
    double loss_diff = 0, loss_floor = 0;
    for (std::size_t i = 0; i < losses.size(); ++i) {
      loss_diff = std::max(loss_diff, std::fabs(static_cast<double>(losses[i]) - reference.losses[i]));
      loss_floor = std::max(loss_floor, std::fabs(static_cast<double>(reordered.losses[i]) - reference.losses[i]));
    }
    // The noise floor of the parameters: the whole reordered model against the whole reference.
    double param_floor = 0;
    for (const auto& [name, t] : reference.parameters) {
      const auto a = t.to_host(), b = reordered.parameters.at(name).to_host();
      for (std::size_t i = 0; i < a.size(); ++i) param_floor = std::max(param_floor, std::fabs(static_cast<double>(a[i]) - b[i]));
    }
    const double param_diff = largest_difference(*model, reference, topology);
    const double tolerance = 1e-3 * o.lr * static_cast<double>(o.steps);
    auto within = [&](double d, double floor) { return d <= tolerance || d <= kDriftFactor * floor; };
    passed = within(param_diff, param_floor) && within(loss_diff, loss_floor);
    log("verify against the unsharded GPT on one rank: parameters within %.3g (noise floor %.3g), losses within %.3g "
        "(noise floor %.3g): %s\n", param_diff, param_floor, loss_diff, loss_floor, passed ? "PASSED" : "FAILED");
    session.metrics.write({{"event", "verify"}, {"param_diff", param_diff}, {"param_floor", param_floor},
                           {"loss_diff", loss_diff}, {"loss_floor", loss_floor}, {"passed", passed}});
  }
  log("%s\n", passed ? "PASSED" : "FAILED");
  return passed ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  comm::Environment env(argc, argv);
  CLI::App app{"Chapter 08: tensor and pipeline parallelism, with data parallelism on top"};
  Options o;
  o.models.model = "gpt";
  cli::add_common_options(app, o.common);
  cli::add_distributed_options(app, o.distributed);
  cli::add_model_options(app, o.models);
  app.add_option("--tp", o.tp, "Tensor-parallel ranks (split every layer)")->check(CLI::Range(1, 1024))->capture_default_str();
  app.add_option("--pp", o.pp, "Pipeline stages (split the layers)")->check(CLI::Range(1, 1024))->capture_default_str();
  app.add_option("--dp", o.dp, "Data-parallel replicas (0: what the world leaves)")->check(CLI::Range(0, 1 << 20))
      ->capture_default_str();
  app.add_option("--micro-batches", o.micro_batches, "Micro-batches per step on each replica")
      ->check(CLI::Range(1, 4096))->capture_default_str();
  app.add_option("--schedule", o.schedule, "Pipeline schedule: gpipe or 1f1b")
      ->check(CLI::IsMember({"gpipe", "1f1b"}))->capture_default_str();
  app.add_option("--steps", o.steps, "Optimizer steps")
      ->check(cli::PositiveInteger & CLI::Range(std::int64_t{1}, std::int64_t{1000000}))->capture_default_str();
  app.add_option("--global-batch", o.global_batch, "Samples per optimizer step, over all replicas")
      ->check(cli::PositiveInteger & CLI::Range(std::int64_t{1}, std::int64_t{1} << 20))->capture_default_str();
  app.add_option("--lr", o.lr, "AdamW's peak learning rate")->check(cli::PositiveFinite)->capture_default_str();
  app.add_option("--log-every", o.log_every, "Print every N steps")->check(cli::PositiveInteger)->capture_default_str();
  app.add_flag("--verify", o.verify, "Check every step's loss and the final parameters against the unsharded GPT");
  return cli::run(app, argc, argv, [&] {
    if (o.models.model != "gpt") throw UsageError("--model: chapter 08 splits the GPT; only --model gpt is here yet");
    if (!o.models.data.empty()) throw UsageError("--data: chapter 08 trains on the addition task only");
    auto session = cli::start_session(o.common, o.distributed, parallel::GridShape{o.tp, o.pp, o.dp});
    return run(o, session);
  });
}
