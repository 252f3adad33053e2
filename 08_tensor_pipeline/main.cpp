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
#include "common/autograd/autograd.h"              // NoGradGuard, for clipping
#include "common/comm/environment.h"               // MPI start-up
#include "common/core/log.h"                       // rank 0 prints
#include "common/metrics/charts.h"                 // the charts, through scripts/plot.py
#include "common/metrics/trace.h"                  // the timeline as Chrome trace JSON
#include "common/ops/ops.h"                        // cross_entropy, narrow
#include "common/optim/lr_scheduler.h"             // warm-up and cosine decay
#include "common/optim/optimizer.h"                // AdamW with GPT-2's decay groups
#include "common/data/sampling.h"                  // SampleStream: every step a whole global batch
#include "common/parallel/distributed_sampler.h"   // share_of: each DP replica's share of it
#include "common/parallel/pipeline.h"              // stages and the schedule's executor
#include "common/parallel/replicas.h"              // on_rank0
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
  double clip = 1.0;  // the gradient's global norm, as GPT-2 (0: off)
  int log_every = 5;
  bool verify = false;
  bool sweep = false;         // both schedules at m = 1..16, with the charts
  std::string charts = "pipeline";
  std::string trace;          // the last step's timeline, Chrome trace JSON (and a PNG beside it)
  std::string fault = "none";
};

// AdamW as GPT-2 trains (betas 0.9, 0.95; decay on matrices and embeddings only) with warm-up and
// cosine decay; the gradient is clipped to --clip by the caller, who knows how it is split.
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
Reference train_reference(const Options& o, const nn::GptTask& task, const data::SampleStream& stream, Device device,
                          bool reversed) {
  nn::GPT model(task.config, device, o.common.seed);
  Trainer trainer(model.parameters(), o);
  Reference r;
  for (std::int64_t step = 0; step < o.steps; ++step) {
    auto samples = stream.take(step * o.global_batch, o.global_batch);
    if (reversed) std::reverse(samples.begin(), samples.end());
    const auto batch = task.data->batch(samples, device);
    Tensor loss = cross_entropy(model(batch.ids), batch.targets, data::AdditionTask::kIgnore);
    r.losses.push_back(loss.item());
    loss.backward();
    if (o.clip > 0) optim::clip_grad_norm_(model.parameters(), o.clip);
    trainer.step(step);
  }
  for (const auto& [name, p] : model.named_parameters()) r.parameters[name] = p;
  return r;
}

// Whether tensor parallelism splits this parameter (the rest is whole on every TP rank).
bool split_by_tp(const std::string& name) {
  auto ends_with = [&](const std::string& tail) {
    return name.size() >= tail.size() && name.compare(name.size() - tail.size(), tail.size(), tail) == 0;
  };
  return name == "transformer.wte.weight" || ends_with("mlp.c_fc.weight") || ends_with("mlp.c_fc.bias") ||
         ends_with("attn.c_attn.weight") || ends_with("attn.c_attn.bias") || ends_with("c_proj.weight");
}

// torch.nn.utils.clip_grad_norm_ over the whole model, which no rank holds: each rank sums the squares
// of the parts only it holds (a parameter whole on every TP rank counts on TP rank 0; the tied table,
// on the first and the last stage, counts on the first), the sums are added over the TP group and then
// the pipeline, and every rank scales its gradients by the same factor. Replicas agree after the DP
// average, so each computes the same norm.
double clip_across_the_grid(parallel::PipelineStageGPT& stage, parallel::Topology& topology, double max_norm) {
  double squares = 0;
  for (const auto& [name, p] : stage.named_parameters()) {
    const bool mine = (topology.tp_size() == 1 || split_by_tp(name) || topology.tp_rank() == 0) &&
                      !(name == "transformer.wte.weight" && stage.is_last() && !stage.is_first());
    if (!mine || !p.grad().defined()) continue;
    for (float g : p.grad().to_host()) squares += static_cast<double>(g) * g;
  }
  Tensor total = Tensor::from_host({static_cast<float>(squares)}, {1});
  if (topology.tp_size() > 1) topology.tp_group().all_reduce(total, comm::ReduceOp::sum);
  if (topology.pp_size() > 1) topology.pp_group().all_reduce(total, comm::ReduceOp::sum);
  const double norm = std::sqrt(static_cast<double>(total.item()));
  const double coefficient = max_norm / (norm + 1e-6);
  if (coefficient < 1.0)
    for (const Tensor& p : stage.parameters()) {
      if (!p.grad().defined()) continue;
      Tensor g = p.grad();
      autograd::NoGradGuard no_grad;
      g.copy_from(scale(g, static_cast<float>(coefficient)));
    }
  return norm;
}

// This rank's part of a reference parameter: a stage keeps GPT-2's names, and with TP its slice.
Tensor part_of(const std::string& name, const Reference& reference, parallel::Topology& topology) {
  const Tensor& whole = reference.parameters.at(name);
  if (topology.tp_size() == 1) return whole;
  auto ends_with = [&](const std::string& tail) {
    return name.size() >= tail.size() && name.compare(name.size() - tail.size(), tail.size(), tail) == 0;
  };
  comm::Communicator& tp = topology.tp_group();
  if (!split_by_tp(name)) return whole;
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

// One training run on the grid with `m` micro-batches and `schedule`, and what it measured: every
// step's loss (the global batch's), and for each stage (gathered on every rank) its bubble, its peak
// activations and the timeline of its last step.
struct GridRun {
  std::unique_ptr<parallel::PipelineStageGPT> stage;
  std::vector<float> losses;
  std::vector<double> bubble, peak_activations;  // per stage
  std::vector<std::vector<parallel::TimedAction>> timeline;  // per stage, the last step
  double step_ms = 0;  // the whole step (pipeline, DP average, update), the slowest rank's mean
};

GridRun train_grid(const Options& o, const nn::GptTask& task, parallel::Topology& topology, Device device,
                   const std::string& schedule_name, int m, metrics::MetricsWriter* metrics) {
  const int dp = topology.dp_size(), p = topology.pp_size();
  const std::int64_t local_batch = o.global_batch / dp, micro = local_batch / m;
  // The whole model, made alike on every rank from the seed; each rank keeps its part of it: its
  // stage's layers (all of them when --pp is 1), each split across its TP group.
  nn::GPT full(task.config, device, o.common.seed);
  GridRun run;
  run.stage = std::make_unique<parallel::PipelineStageGPT>(full, topology.pp_group(), &topology.tp_group());
  const auto schedule = parallel::make_schedule(schedule_name, p, m);
  // Every step takes the next whole global batch of the stream, across epochs (chapter 06's order), so
  // every micro-batch has the same size; each replica takes its share.
  data::SampleStream stream(task.task.size, o.common.seed);
  Trainer trainer(run.stage->parameters(), o);
  double busy_ms = 0, step_ms = 0;
  std::int64_t peak = 0;
  std::vector<parallel::TimedAction> last;
  double whole_ms = 0;
  for (std::int64_t step = 0; step < o.steps; ++step) {
    const auto step_begin = std::chrono::steady_clock::now();
    const auto samples = parallel::DistributedSampler::share_of(stream.take(step * o.global_batch, o.global_batch),
                                                                topology.dp_rank(), dp);
    std::vector<Tensor> ids, targets;
    for (int i = 0; i < m; ++i) {
      const std::vector<std::int64_t> part(samples.begin() + i * micro, samples.begin() + (i + 1) * micro);
      auto b = task.data->batch(part, device);
      ids.push_back(b.ids);
      targets.push_back(b.targets);
    }
    const auto result =
        parallel::run_pipeline(*run.stage, topology.pp_group(), schedule, ids, targets, data::AdditionTask::kIgnore);
    if (step > 0 || o.steps == 1) {  // the first step warms up allocators
      step_ms += result.step_ms;
      for (const auto& a : result.timeline) busy_ms += a.end_ms - a.begin_ms;
    }
    peak = std::max(peak, result.peak_activation_bytes);
    last = result.timeline;
    // Data parallelism on top: the replicas average their gradients over the DP group only.
    // --fault skip-dp-average leaves each replica with its own share's gradient.
    if (dp > 1 && o.fault != "skip-dp-average")
      for (const Tensor& param : run.stage->parameters()) {
        Tensor g = param.grad();
        topology.dp_group().all_reduce(g, comm::ReduceOp::average);
      }
    if (o.clip > 0) clip_across_the_grid(*run.stage, topology, o.clip);
    trainer.step(step);
    if (step > 0 || o.steps == 1)
      whole_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - step_begin).count();
    Tensor global = Tensor::from_host({result.loss}, {1});
    topology.dp_group().all_reduce(global, comm::ReduceOp::average);
    run.losses.push_back(global.item());
    if (metrics && (step % o.log_every == 0 || step + 1 == o.steps)) {
      log("step %4lld  loss %.6f\n", static_cast<long long>(step), run.losses.back());
      metrics->write({{"event", "step"}, {"step", step}, {"loss", run.losses.back()}});
    }
  }
  // Each stage's figures, from its first TP rank of the first replica, to every rank: [bubble, peak,
  // then per action: op, micro-batch, begin, end].
  const std::size_t per_stage = 2 + 4 * last.size();
  std::vector<float> mine(per_stage * static_cast<std::size_t>(p), 0.0f);
  if (topology.tp_rank() == 0 && topology.dp_rank() == 0) {
    float* at = mine.data() + per_stage * static_cast<std::size_t>(topology.pp_rank());
    at[0] = step_ms > 0 ? static_cast<float>(1.0 - busy_ms / step_ms) : 0.0f;
    at[1] = static_cast<float>(peak);
    for (std::size_t k = 0; k < last.size(); ++k) {
      at[2 + 4 * k] = last[k].action.op == parallel::PipeOp::forward ? 0.0f : 1.0f;
      at[3 + 4 * k] = static_cast<float>(last[k].action.micro_batch);
      at[4 + 4 * k] = static_cast<float>(last[k].begin_ms);
      at[5 + 4 * k] = static_cast<float>(last[k].end_ms);
    }
  }
  Tensor all = Tensor::from_host(mine, {static_cast<std::int64_t>(mine.size())});
  topology.world().all_reduce(all, comm::ReduceOp::sum);
  const auto v = all.to_host();
  Tensor slowest = Tensor::from_host({static_cast<float>(whole_ms / static_cast<double>(std::max<std::int64_t>(1, o.steps - 1)))}, {1});
  topology.world().all_reduce(slowest, comm::ReduceOp::max);
  run.step_ms = slowest.item();
  run.timeline.resize(static_cast<std::size_t>(p));
  for (int s = 0; s < p; ++s) {
    const float* at = v.data() + per_stage * static_cast<std::size_t>(s);
    run.bubble.push_back(at[0]);
    run.peak_activations.push_back(at[1]);
    for (std::size_t k = 0; k < last.size(); ++k)
      run.timeline[static_cast<std::size_t>(s)].push_back(
          {{at[2 + 4 * k] == 0.0f ? parallel::PipeOp::forward : parallel::PipeOp::backward, static_cast<int>(at[3 + 4 * k])},
           at[4 + 4 * k], at[5 + 4 * k]});
  }
  return run;
}

// The last step of every stage as a Chrome trace (one row per stage), and as a PNG beside it.
void write_timeline(const GridRun& run, const std::string& path, const std::string& label) {
  metrics::ChromeTrace trace;
  trace.label(label);
  for (std::size_t s = 0; s < run.timeline.size(); ++s)
    for (const auto& a : run.timeline[s]) {
      std::string name(1, a.action.op == parallel::PipeOp::forward ? 'F' : 'B');
      name += std::to_string(a.action.micro_batch);
      trace.add(static_cast<int>(s), "stage " + std::to_string(s), name, a.begin_ms, a.end_ms);
    }
  trace.write(path);
  std::string why;
  const std::string png = path.substr(0, path.rfind('.')) + ".png";
  if (metrics::draw_timeline(path, png, &why))
    log("timeline: %s (Chrome trace, opens in Perfetto) and %s\n", path.c_str(), png.c_str());
  else
    log("timeline: %s (Chrome trace, opens in Perfetto); no PNG: %s\n", path.c_str(), why.c_str());
}

void report_stages(const GridRun& run, const Options& o, int m, const std::string& schedule, metrics::MetricsWriter& metrics,
                   const char* event) {
  const int p = static_cast<int>(run.bubble.size());
  const double theory = parallel::bubble_fraction(p, m);
  log("pipeline: %d stages, %d micro-batches, %s; bubble (idle share of the step) against (p-1)/(m+p-1) = %.3f:\n", p,
      m, schedule.c_str(), theory);
  for (int s = 0; s < p; ++s) {
    log("  stage %d  bubble %.3f  peak activations %s\n", s, run.bubble[static_cast<std::size_t>(s)],
        format_bytes(static_cast<std::int64_t>(run.peak_activations[static_cast<std::size_t>(s)])).c_str());
    metrics.write({{"event", event}, {"stage", s}, {"stages", p}, {"micro_batches", m}, {"schedule", schedule},
                   {"bubble", run.bubble[static_cast<std::size_t>(s)]}, {"theory", theory},
                   {"peak_activation_bytes", run.peak_activations[static_cast<std::size_t>(s)]}});
  }
  (void)o;
}

// --sweep: both schedules at m = 1, 2, 4, 8 and 16, their bubbles against the theory and their
// activations; the charts, and each schedule's timeline at 4 micro-batches.
int sweep(const Options& o, const nn::GptTask& task, parallel::Topology& topology, Device device,
          metrics::MetricsWriter& metrics) {
  const std::vector<int> counts = {1, 2, 4, 8, 16};
  if (o.global_batch % (static_cast<std::int64_t>(topology.dp_size()) * 16) != 0)
    throw UsageError("--global-batch: --sweep runs up to 16 micro-batches per replica, so " +
                     std::to_string(o.global_batch) + " must divide by DP x 16 (" +
                     std::to_string(topology.dp_size() * 16) + ")");
  std::vector<nlohmann::json> records;
  for (const std::string schedule : {"gpipe", "1f1b"})
    for (int m : counts) {
      GridRun run = train_grid(o, task, topology, device, schedule, m, nullptr);
      const int p = topology.pp_size();
      for (int s = 0; s < p; ++s)
        records.push_back({{"event", "pipeline_sweep"}, {"stage", s}, {"stages", p}, {"micro_batches", m},
                           {"schedule", schedule}, {"bubble", run.bubble[static_cast<std::size_t>(s)]},
                           {"theory", parallel::bubble_fraction(p, m)},
                           {"peak_activation_bytes", run.peak_activations[static_cast<std::size_t>(s)]}});
      report_stages(run, o, m, schedule, metrics, "pipeline_sweep");
      if (m == 4 && topology.rank() == 0)
        write_timeline(run, o.charts + "_timeline_" + schedule + ".json",
                       schedule + ", " + std::to_string(p) + " stages, 4 micro-batches: the last step");
    }
  parallel::on_rank0(topology.world(), [&] {
    std::string why;
    if (metrics::draw_charts("pipeline", records, o.charts, &why))
      log("charts: %s_bubble.png, %s_activations.png\n", o.charts.c_str(), o.charts.c_str());
    else
      log("charts: not drawn: %s\n", why.c_str());
  });
  log("PASSED\n");
  return 0;
}

int run(const Options& o, cli::Session& session) {
  parallel::Topology& topology = *session.topology;
  const Device device = session.device;
  const int dp = topology.dp_size();
  if (o.fault == "skip-dp-average" && dp < 2)
    throw UsageError("--fault: skip-dp-average needs data parallelism (--dp 2 or more)");
  if (o.global_batch % (static_cast<std::int64_t>(dp) * o.micro_batches) != 0)
    throw UsageError("--global-batch: " + std::to_string(o.global_batch) + " is not divisible by DP x --micro-batches (" +
                     std::to_string(dp) + " x " + std::to_string(o.micro_batches) + ")");
  nn::GptTask task = cli::gpt_addition_task(o.models, 0, false, device, o.common.seed);
  const std::int64_t local_batch = o.global_batch / dp, micro = local_batch / o.micro_batches;
  log("Chapter 08: %s; %s; global batch %lld = DP %d x %d micro-batches of %lld (%s schedule); %lld steps\n",
      topology.describe().c_str(), task.task.description.c_str(), static_cast<long long>(o.global_batch), dp,
      o.micro_batches, static_cast<long long>(micro), o.schedule.c_str(), static_cast<long long>(o.steps));
  if (o.sweep) {
    if (topology.pp_size() < 2) throw UsageError("--sweep: needs a pipeline (--pp 2 or more)");
    return sweep(o, task, topology, device, session.metrics);
  }
  if (topology.pp_size() > 1)
    log("%s", parallel::describe(parallel::make_schedule(o.schedule, topology.pp_size(), o.micro_batches)).c_str());
  GridRun run = train_grid(o, task, topology, device, o.schedule, o.micro_batches, &session.metrics);
  const std::vector<float>& losses = run.losses;
  nn::Module* model = run.stage.get();
  data::SampleStream stream(task.task.size, o.common.seed);
  if (topology.pp_size() > 1) report_stages(run, o, o.micro_batches, o.schedule, session.metrics, "pipeline_stage");
  const double tokens = static_cast<double>(o.global_batch * task.config.block_size);
  log("throughput: %.0f tokens/s (step %.2f ms, the slowest rank's mean after the first)\n",
      tokens / (run.step_ms / 1000.0), run.step_ms);
  session.metrics.write({{"event", "throughput"}, {"grid", topology.describe().substr(0, topology.describe().rfind("-Rank"))},
                         {"tokens_per_s", tokens / (run.step_ms / 1000.0)}, {"step_ms", run.step_ms}});
  if (!o.trace.empty() && topology.rank() == 0)
    write_timeline(run, o.trace, topology.describe().substr(0, topology.describe().rfind("-Rank")) + ", " + o.schedule +
                                     ", " + std::to_string(o.micro_batches) + " micro-batches: the last step");

  bool passed = true;
  if (o.verify) {
    const Reference reference = train_reference(o, task, stream, device, false);
    const Reference reordered = train_reference(o, task, stream, device, true);
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
  app.add_option("--clip", o.clip, "Clip the gradient's global norm (over the whole grid) to this; 0: off")
      ->check(cli::NonNegativeFinite)->capture_default_str();
  app.add_option("--log-every", o.log_every, "Print every N steps")->check(cli::PositiveInteger)->capture_default_str();
  app.add_flag("--verify", o.verify, "Check every step's loss and the final parameters against the unsharded GPT");
  app.add_option("--fault", o.fault, "Break the training on purpose, to see --verify catch it: none, or "
                                     "skip-dp-average (the replicas never average their gradients)")
      ->check(CLI::IsMember({"none", "skip-dp-average"}))->capture_default_str();
  app.add_option("--trace", o.trace, "Write the last step's timeline of every stage here (Chrome trace JSON) and a "
                                     "PNG beside it");
  app.add_flag("--sweep", o.sweep, "Run both schedules at 1, 2, 4, 8 and 16 micro-batches and draw the bubble and the "
                                   "activations against them");
  app.add_option("--charts", o.charts, "With --sweep: PREFIX_bubble.png, PREFIX_activations.png and the timelines")
      ->capture_default_str();
  return cli::run(app, argc, argv, [&] {
    if (o.models.model != "gpt") throw UsageError("--model: chapter 08 splits the GPT; only --model gpt is here yet");
    if (!o.models.data.empty()) throw UsageError("--data: chapter 08 trains on the addition task only");
    auto session = cli::start_session(o.common, o.distributed, parallel::GridShape{o.tp, o.pp, o.dp});
    return run(o, session);
  });
}
