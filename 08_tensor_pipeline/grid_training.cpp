// One training run on the grid: each rank builds its part of the model, and every step runs the
// schedule (the GPT) or accumulates the micro-batches (the MLP) while chapter 04/05's DDP averages the
// gradients over the DP group, then clips by the whole grid's norm and steps.
#include "grid_training.h"

#include <chrono>
#include <cmath>
#include <optional>

#include "common/autograd/autograd.h"              // NoGradGuard, for clipping
#include "common/comm/faults.h"                    // --fault skip-tp-all-reduce
#include "common/core/errors.h"
#include "common/core/log.h"
#include "common/core/memory.h"                    // peak activations
#include "common/data/sampling.h"                  // SampleStream: every step a whole global batch
#include "common/ops/ops.h"
#include "common/parallel/distributed_sampler.h"   // share_of: each DP replica's share of it
#include "common/parallel/tensor_parallel_mlp.h"
#include "verify_grid.h"                           // --verify, in lock-step

namespace course::chapter08 {

ChapterTask make_task(const Options& o, Device device) {
  ChapterTask t;
  if (o.models.model == "mlp") {
    // GELU, as the GPT's MLP: tensor parallelism splits a row layer's sums, and a ReLU whose input lies
    // within that rounding of zero would flip, a whole sample's gradient through one unit that no
    // rounding floor describes (common/verify/compare.h). GELU's gradient moves by rounding only.
    t.task = nn::mlp_task(4096, 16, o.hidden, o.layers, device, o.common.seed, nn::Activation::gelu);
    return t;
  }
  nn::GptTask gpt = cli::gpt_addition_task(o.models, 0, false, device, o.common.seed);
  t.task = gpt.task;
  t.addition = gpt.data;
  t.config = gpt.config;
  return t;
}

Trainer::Trainer(const std::vector<Tensor>& params, const Options& o) {
  adam = std::make_unique<optim::Adam>(optim::weight_decay_groups(params, 0.1f), o.lr, 0.9f, 0.95f, 1e-8f, true);
  const std::int64_t warmup = std::min<std::int64_t>(100, o.steps / 10);
  if (o.steps > warmup) schedule = optim::warmup_cosine(o.lr, warmup, o.steps, o.lr / 10);
}

void Trainer::step(std::int64_t step) {
  if (schedule) adam->set_lr(schedule->lr_at(step));
  adam->step();
  adam->zero_grad();
}

bool counts_once(const GridRun& run, parallel::Topology& topology, const std::string& name) {
  const bool tied_copy = run.stage && name == "transformer.wte.weight" && run.stage->is_last() && !run.stage->is_first();
  return (topology.tp_size() == 1 || run.model->is_split(name) || topology.tp_rank() == 0) && !tied_copy;
}

namespace {

// torch.nn.utils.clip_grad_norm_ over the whole model, which no rank holds: each rank sums the squares
// of the parts that count once (counts_once), the sums are added over the TP group and then the
// pipeline, and every rank scales its gradients by the same factor (optim::clip_coefficient). Replicas
// agree after the DP average, so each computes the same norm. Returns it.
double clip_across_the_grid(const GridRun& run, parallel::Topology& topology, double max_norm) {
  double squares = 0;
  for (const auto& [name, p] : run.model->named_parameters()) {
    if (!counts_once(run, topology, name) || !p.grad().defined()) continue;
    for (float g : p.grad().to_host()) squares += static_cast<double>(g) * g;
  }
  Tensor total = Tensor::from_host({static_cast<float>(squares)}, {1});
  if (topology.tp_size() > 1) topology.tp_group().all_reduce(total, comm::ReduceOp::sum);
  if (topology.pp_size() > 1) topology.pp_group().all_reduce(total, comm::ReduceOp::sum);
  const double norm = std::sqrt(static_cast<double>(total.item()));
  const float coefficient = optim::clip_coefficient(norm, max_norm);
  if (coefficient != 1.0f)
    for (const Tensor& p : run.model->parameters()) {
      if (!p.grad().defined()) continue;
      Tensor g = p.grad();
      autograd::NoGradGuard no_grad;
      g.copy_from(scale(g, coefficient));
    }
  return norm;
}

// The MLP's step on one replica: its micro-batches one after the other, each loss a 1/m share of the
// mean (the micro-batches are the same size), timed like a one-stage pipeline; with DDP, all but the
// last backward under no_sync (gradient accumulation, chapter 02).
parallel::PipelineStep accumulate(nn::Module& model, const nn::TrainingTask& task,
                                  const std::vector<std::vector<std::int64_t>>& micro_batches, Device device,
                                  parallel::DistributedDataParallel* ddp) {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  const auto since = [&] { return std::chrono::duration<double, std::milli>(Clock::now() - start).count(); };
  const std::int64_t before = memory_stats(device).current_of(MemoryCategory::activations);
  reset_peak_memory(device);
  parallel::PipelineStep step;
  const float share = 1.0f / static_cast<float>(micro_batches.size());
  for (std::size_t i = 0; i < micro_batches.size(); ++i) {
    const double begin = since();
    Tensor loss = scale(task.loss(model, micro_batches[i]), share);
    step.loss += loss.item();
    const double middle = since();
    step.timeline.push_back({{parallel::PipeOp::forward, static_cast<int>(i)}, begin, middle});
    std::optional<parallel::DistributedDataParallel::NoSyncGuard> accumulate_only;
    if (ddp && i + 1 < micro_batches.size()) accumulate_only.emplace(*ddp);
    loss.backward();
    step.timeline.push_back({{parallel::PipeOp::backward, static_cast<int>(i)}, middle, since()});
  }
  step.step_ms = since();
  step.peak_activation_bytes = memory_stats(device).peak_of(MemoryCategory::activations) - before;
  return step;
}

}  // namespace

GridRun train_grid(const Options& o, const ChapterTask& task, parallel::Topology& topology, Device device,
                   const std::string& schedule_name, int m, metrics::MetricsWriter* metrics, bool verified) {
  const int dp = topology.dp_size(), p = topology.pp_size();
  const std::int64_t local_batch = o.global_batch / dp, micro = local_batch / m;
  std::int64_t step = 0;
  // --fault skip-tp-all-reduce: the layers' TP group skips its all-reduces from --fault-from-step on.
  std::unique_ptr<comm::Communicator> faulty_tp;
  if (o.faults.fault == "skip-tp-all-reduce")
    faulty_tp = comm::skip_all_reduces(topology.tp_group().split(0, topology.tp_rank()),
                                       [&] { return o.faults.at("skip-tp-all-reduce", step); });
  comm::Communicator& tp = faulty_tp ? *faulty_tp : topology.tp_group();
  // The whole model, made alike on every rank from the seed; each rank keeps its part of it: its
  // stage's layers (all of them when --pp is 1), each split across its TP group.
  GridRun run;
  if (task.is_gpt()) {
    nn::GPT full(task.config, device, o.common.seed);
    auto stage = std::make_shared<parallel::PipelineStageGPT>(full, topology.pp_group(), &tp, o.sequence_parallel);
    run.stage = stage.get();
    run.model = std::move(stage);
  } else {
    auto full = task.task.make_model(o.common.seed);
    run.model = std::make_shared<parallel::TensorParallelMLP>(dynamic_cast<nn::Sequential&>(*full), tp);
  }
  // Data parallelism on top: chapter 04/05's DDP on the DP group only, each rank with the ranks that
  // hold the same part in the other replicas; it averages in buckets during the step's last backward.
  // --fault skip-dp-average gives it a communication hook that does nothing: each replica keeps its
  // own share's gradient.
  if (dp > 1) {
    run.ddp = std::make_unique<parallel::DistributedDataParallel>(run.model, topology.dp_group());
    if (o.faults.fault == "skip-dp-average")
      run.ddp->register_comm_hook([&](comm::Communicator& group, Tensor& g) {
        if (o.faults.at("skip-dp-average", step)) return comm::completed_work();
        return group.all_reduce_async(g, comm::ReduceOp::average);
      });
  }
  std::unique_ptr<GridCheck> check;
  if (verified) check = std::make_unique<GridCheck>(o, task, run, topology);
  const auto schedule = parallel::make_schedule(schedule_name, p, m);
  // Every step takes the next whole global batch of the stream, across epochs (chapter 06's order), so
  // every micro-batch has the same size; each replica takes its share.
  data::SampleStream stream(task.task.size, o.common.seed);
  Trainer trainer(run.model->parameters(), o);
  double busy_ms = 0, step_ms = 0;
  std::int64_t peak = 0;
  std::vector<parallel::TimedAction> last;
  double whole_ms = 0;
  for (step = 0; step < o.steps; ++step) {
    const auto step_begin = std::chrono::steady_clock::now();
    double checking_ms = 0;  // --verify's own work, left out of the step's time
    const auto checking = [&](auto&& work) {
      const auto t = std::chrono::steady_clock::now();
      work();
      checking_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
    };
    if (check) checking([&] { check->begin_step(step); });
    const auto samples = parallel::DistributedSampler::share_of(stream.take(step * o.global_batch, o.global_batch),
                                                                topology.dp_rank(), dp);
    std::vector<std::vector<std::int64_t>> parts;
    for (int i = 0; i < m; ++i) parts.emplace_back(samples.begin() + i * micro, samples.begin() + (i + 1) * micro);
    if (o.faults.at("lose-micro-batch", step)) parts.pop_back();  // the step's last micro-batch never runs
    parallel::PipelineStep result;
    if (run.stage) {
      std::vector<Tensor> ids, targets;
      for (const auto& part : parts) {
        auto b = task.addition->batch(part, device);
        ids.push_back(b.ids);
        targets.push_back(b.targets);
      }
      result = parallel::run_pipeline(*run.stage, topology.pp_group(),
                                      parts.size() == static_cast<std::size_t>(m)
                                          ? schedule
                                          : parallel::make_schedule(schedule_name, p, static_cast<int>(parts.size())),
                                      ids, targets, data::AdditionTask::kIgnore, run.ddp.get());
      // After backward, Megatron-LM's finalize_model_grads (DDP averaged over DP during the last
      // backward): the sequence-parallel sums, then the tied table's two halves.
      if (!o.faults.at("skip-sp-sum", step)) run.stage->sync_sequence_parallel_gradients();
      if (!o.faults.at("skip-tied-exchange", step)) run.stage->sync_tied_gradients();
    } else {
      result = accumulate(*run.model, task.task, parts, device, run.ddp.get());
    }
    if (step > 0 || o.steps == 1) {  // the first step warms up allocators
      step_ms += result.step_ms;
      for (const auto& a : result.timeline) busy_ms += a.end_ms - a.begin_ms;
    }
    peak = std::max(peak, result.peak_activation_bytes);
    last = result.timeline;
    Tensor global = Tensor::from_host({result.loss}, {1});
    topology.dp_group().all_reduce(global, comm::ReduceOp::average);
    if (check) checking([&] { check->check_gradient(step, global.item()); });
    const double norm = o.clip > 0 ? clip_across_the_grid(run, topology, o.clip) : 0.0;
    trainer.step(step);
    if (check) checking([&] { check->check_update(step, norm); });
    if (step > 0 || o.steps == 1)
      whole_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - step_begin).count() -
                  checking_ms;
    run.losses.push_back(global.item());
    if (metrics && (step % o.log_every == 0 || step + 1 == o.steps)) {
      log("step %4lld  loss %.6f\n", static_cast<long long>(step), run.losses.back());
      metrics->write({{"event", "step"}, {"step", step}, {"loss", run.losses.back()}});
    }
  }
  if (check) run.check = check->finish();
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

}  // namespace course::chapter08
