// The parts of chapter 08's step: the model each rank holds, the micro-batches, forward and backward
// with or without a pipeline, clipping across the grid, and the run's figures.
#include "08_tensor_pipeline/grid_training.h"

#include <cmath>
#include <optional>

#include "common/comm/agree.h"                     // all_reduce_scalar, all_gather_values
#include "common/autograd/autograd.h"              // NoGradGuard, for clipping
#include "common/faults/communicator.h"              // --fault skip-tp-all-reduce
#include "common/faults/faults.h"                    // --fault: where each acts
#include "common/parallel/comm_hooks.h"            // --reduce-dtype
#include "common/core/errors.h"
#include "common/core/memory.h"                    // peak activations
#include "common/ops/ops.h"
#include "common/parallel/distributed_sampler.h"   // share_of: each DP replica's share of it
#include "common/parallel/replicas.h"            // --fault stray-replica
#include "common/parallel/tensor_parallel_gpt.h"     // --fault exact-gelu
#include "common/parallel/tensor_parallel_mlp.h"

namespace course::chapter08 {

ChapterTask make_task(const Options& o, Device device) {
  ChapterTask t;
  cli::check_recompute(o.models);
  if (o.models.model == "mlp") {
    // GELU, as the GPT's MLP: tensor parallelism splits a row layer's sums, and a ReLU whose input lies
    // within that rounding of zero would flip, a whole sample's gradient through one unit that no
    // rounding floor describes (common/verify/compare.h). GELU's gradient moves by rounding only.
    t.task = nn::mlp_task(o.mlp.samples, o.mlp.features, o.mlp.hidden, o.mlp.layers, device, o.common.seed, nn::Activation::gelu);
    return t;
  }
  if (!o.models.data.empty()) {  // --data: windows of text, as long as --block-size (a long context)
    nn::GptTextTask text = cli::gpt_text_task(o.models, device);
    t.task = text.task;
    t.text = text.data;
    t.config = text.config;
    t.sequence = text.config.block_size;
    return t;
  }
  nn::GptTask gpt = cli::gpt_addition_task(o.models, o.mlp.samples, o.mlp.samples_given, device, o.common.seed);
  t.sequence = gpt.data->sequence_length();
  if (o.cp > 1) {  // padded to what the context-parallel ranks split, the position table as long
    t.sequence = parallel::context_parallel_length(t.sequence, o.cp, parallel::parse_context_method(o.cp_method));
    if (gpt.config.block_size < t.sequence) {
      cli::ModelOptions longer = o.models;
      longer.gpt.block_size = t.sequence;
      gpt = cli::gpt_addition_task(longer, o.mlp.samples, o.mlp.samples_given, device, o.common.seed);
    }
  }
  t.task = gpt.task;
  t.addition = gpt.data;
  t.config = gpt.config;
  return t;
}

data::AdditionTask::Batch ChapterTask::batch(const std::vector<std::int64_t>& part, Device device) const {
  if (text) {
    auto windows = text->batch(part, device);
    return {windows.ids, windows.targets};
  }
  data::AdditionTask::Batch b = addition->batch(part, device);
  const std::int64_t t = addition->sequence_length();
  if (sequence == t) return b;
  const auto n = static_cast<std::int64_t>(part.size());
  const auto ids = b.ids.to_host(), targets = b.targets.to_host();
  std::vector<float> padded_ids(static_cast<std::size_t>(n * sequence), 0.0f),
      padded_targets(static_cast<std::size_t>(n * sequence), static_cast<float>(data::AdditionTask::kIgnore));
  for (std::int64_t s = 0; s < n; ++s)
    for (std::int64_t i = 0; i < t; ++i) {
      padded_ids[static_cast<std::size_t>(s * sequence + i)] = ids[static_cast<std::size_t>(s * t + i)];
      padded_targets[static_cast<std::size_t>(s * sequence + i)] = targets[static_cast<std::size_t>(s * t + i)];
    }
  return {Tensor::from_host(padded_ids, {n, sequence}, device), Tensor::from_host(padded_targets, {n * sequence}, device)};
}

// --fault stray-replica: the last of the replicas holding this rank's part (its data- and context-parallel
// group) moves its first weight one unit in the last place further, as a rank whose update went astray.
static void stray_last_replica(nn::Module& model, parallel::Topology& topology) {
  comm::Communicator& replicas = topology.dp_cp_group();
  if (replicas.rank() == replicas.size() - 1) parallel::stray_by_one_rounding(model.parameters().front());
}

// optim::clip_grad_norm_ over the whole model, which no rank holds: each rank counts the parts that
// count once (TensorParallelModule::counts_once), the sums are added over the TP group and then the
// pipeline, and every rank scales its gradients by the same factor. Replicas agree after the DP average,
// so each computes the same norm. Returns it.
Tensor clip_across_the_grid(const GridRun& run, parallel::Topology& topology, double max_norm) {
  std::vector<Tensor> counted, all;
  for (const auto& [name, p] : run.model->named_parameters()) {
    if (!p.grad().defined()) continue;
    all.push_back(p.grad());
    if (run.model->counts_once(name)) counted.push_back(p.grad());
  }
  return optim::clip_grad_norm_(counted, all, max_norm, {&topology.tp_group(), &topology.pp_group()});
}

std::shared_ptr<parallel::TensorParallelModule> make_split_model(const Options& o, const ChapterTask& task,
                                                                 comm::Communicator& pp, comm::Communicator& tp,
                                                                 int chunks, const parallel::ContextParallel* cp,
                                                                 Device device) {
  if (task.is_gpt()) {
    nn::GPT full(task.config, device, o.common.seed);
    return std::make_shared<parallel::PipelineStageGPT>(full, pp, &tp, o.sequence_parallel, chunks, cp);
  }
  auto full = task.task.make_model(o.common.seed);
  return std::make_shared<parallel::TensorParallelMLP>(dynamic_cast<nn::Sequential&>(*full), tp);
}

Tensor micro_batch_loss(parallel::TensorParallelModule& model, const ChapterTask& task,
                        const std::vector<std::int64_t>& part, const data::AdditionTask::Batch& batch) {
  if (!task.is_gpt()) return task.task.loss(model, part);
  auto& stage = dynamic_cast<parallel::PipelineStageGPT&>(model);
  return stage.loss(stage(batch.ids), reshape(batch.targets, {batch.ids.dim(0), batch.ids.dim(1)}),
                    data::AdditionTask::kIgnore);
}

GridRun make_grid_model(const Options& o, const ChapterTask& task, parallel::Topology& topology, Device device) {
  GridRun run;
  if (faults::armed("skip-tp-all-reduce"))  // the layers' TP group, wrapped
    run.faulty_tp = faults::skip_all_reduces(topology.tp_group().split(0, topology.tp_rank()), "skip-tp-all-reduce");
  comm::Communicator& tp = run.faulty_tp ? *run.faulty_tp : topology.tp_group();
  if (task.is_gpt() && topology.cp_size() > 1)  // --cp: attention through the context-parallel group
    run.cp = std::make_unique<parallel::ContextParallel>(topology.cp_group(), parallel::parse_context_method(o.cp_method));
  run.model = make_split_model(o, task, topology.pp_group(), tp, o.schedule == "interleaved" ? o.virtual_stages : 1,
                               run.cp.get(), device);
  run.stage = dynamic_cast<parallel::PipelineStageGPT*>(run.model.get());
  // The faults of the run's own objects: its CP attention, its blocks, its fix-ups after backward. (The
  // layer code's own faults, sp-gather-rows, ring-drop-block and row-parallel-no-sum, act in the whole
  // process: the 16-bit check's split reference makes them too.)
  if (faults::armed("skip-cp-offset") && run.cp) run.faults_installed.place(run.cp.get());
  if (faults::armed("exact-gelu"))
    for (auto& [name, module] : run.model->named_modules())
      if (auto* block = dynamic_cast<parallel::TensorParallelBlock*>(module)) run.faults_installed.place(block);
  if (faults::armed("skip-sp-sum") || faults::armed("skip-tied-exchange")) run.faults_installed.place(run.model.get());
  if (faults::armed("stray-replica"))  // after the update, before the check judges it
    run.faults_installed.on_step_end([model = run.model, &topology] { stray_last_replica(*model, topology); });
  // Data parallelism on top: each rank with the ranks that hold the same part in the other replicas,
  // and with --cp the other context-parallel ranks (each holds the gradient of its tokens: averaged
  // together, as Megatron-LM's data-parallel group with context parallelism).
  // --fault skip-dp-average gives DDP a communication hook that does nothing: each replica keeps its
  // own share's gradient.
  if (topology.dp_cp_group().size() > 1) {
    parallel::ReducerOptions reduce;
    reduce.reduce_dtype = o.precision.reduce();  // --reduce-dtype
    // Interleaved stages: one DDP per chunk, since each backward pass reaches one chunk's parameters.
    std::vector<std::shared_ptr<nn::Module>> parts{run.model};
    if (run.stage && run.stage->chunks() > 1) parts = run.stage->chunk_modules();
    for (auto& part : parts) {
      run.ddp.push_back(std::make_unique<parallel::DistributedDataParallel>(part, topology.dp_cp_group(), reduce));
      if (faults::armed("skip-dp-average"))
        run.ddp.back()->register_comm_hook([average = parallel::average_hook(reduce.reduce_dtype)](
                                               comm::Communicator& group, Tensor& g) {
          if (faults::active("skip-dp-average")) return comm::completed_work();
          return average(group, g);
        });
    }
  }
  return run;
}

std::vector<std::vector<std::int64_t>> micro_batches(const std::vector<std::int64_t>& batch, int replica, int replicas,
                                                     int m) {
  const auto share = parallel::DistributedSampler::share_of(batch, replica, replicas);
  const auto micro = static_cast<std::ptrdiff_t>(share.size()) / m;
  std::vector<std::vector<std::int64_t>> parts;
  for (int i = 0; i < m; ++i) parts.emplace_back(share.begin() + i * micro, share.begin() + (i + 1) * micro);
  return parts;
}

std::vector<float> micro_batch_weights(const ChapterTask& task, const std::vector<std::vector<std::int64_t>>& parts,
                                       Device device) {
  if (!task.is_gpt()) return std::vector<float>(parts.size(), static_cast<float>(1.0 / static_cast<double>(parts.size())));
  std::vector<Tensor> targets;
  for (const auto& part : parts) targets.push_back(task.batch(part, device).targets);
  return parallel::micro_batch_weights(targets, data::AdditionTask::kIgnore);
}

// --fault lose-micro-batch: the run's step leaves its last micro-batch out (the reference never comes here).
static std::vector<std::vector<std::int64_t>> run_parts(std::vector<std::vector<std::int64_t>> parts) {
  if (faults::active("lose-micro-batch")) parts.pop_back();
  return parts;
}

parallel::PipelineStep run_stages(GridRun& run, const ChapterTask& task, parallel::Topology& topology,
                                  const std::vector<std::vector<std::int64_t>>& all_parts, const std::string& schedule,
                                  const optim::Recipe& training, Device device) {
  const auto parts = run_parts(all_parts);
  std::vector<Tensor> ids, targets;
  for (const auto& part : parts) {
    auto b = task.batch(part, device);
    ids.push_back(b.ids);
    targets.push_back(b.targets);
  }
  const int p = topology.pp_size();
  const parallel::PipelineLinks links{topology.pp_group(), topology.previous_stage(), topology.next_stage()};
  std::vector<parallel::DistributedDataParallel*> replicas;  // DDP of the stage, or of each chunk
  for (auto& ddp : run.ddp) replicas.push_back(ddp.get());
  return parallel::run_pipeline(*run.stage, links,
                                parallel::make_schedule(schedule, p, static_cast<int>(parts.size()), run.stage->chunks()),
                                ids, targets, data::AdditionTask::kIgnore, replicas, &training.mixed_precision());
}

parallel::PipelineStep accumulate(GridRun& run, const ChapterTask& task,
                                  const std::vector<std::vector<std::int64_t>>& all_parts, const optim::Recipe& training,
                                  Device device) {
  const auto parts = run_parts(all_parts);
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  const auto since = [&] { return std::chrono::duration<double, std::milli>(Clock::now() - start).count(); };
  const std::int64_t before = memory_stats(device).current_of(MemoryCategory::activations);
  reset_peak_memory(device);
  // Each micro-batch's weight: its share of what counts, so the sum is the whole share's mean loss.
  const std::vector<float> weight = micro_batch_weights(task, parts, device);
  std::vector<data::AdditionTask::Batch> batches;
  if (task.is_gpt())
    for (const auto& part : parts) batches.push_back(task.batch(part, device));
  parallel::PipelineStep step;
  for (std::size_t i = 0; i < parts.size(); ++i) {
    const double begin = since();
    const Tensor loss = training.mixed_precision().forward([&] {  // under autocast (fp32: off)
      return scale(micro_batch_loss(*run.model, task, parts[i], task.is_gpt() ? batches[i] : data::AdditionTask::Batch{}),
                   weight[i]);
    });
    step.loss += loss.item();
    const double middle = since();
    step.timeline.push_back({{parallel::PipeOp::forward, static_cast<int>(i)}, begin, middle});
    std::optional<parallel::DistributedDataParallel::NoSyncGuard> accumulate_only;
    if (!run.ddp.empty() && i + 1 < parts.size()) accumulate_only.emplace(*run.ddp.front());
    training.mixed_precision().backward(loss);  // from the loss times fp16's scale
    step.timeline.push_back({{parallel::PipeOp::backward, static_cast<int>(i)}, middle, since()});
  }
  step.step_ms = since();
  step.peak_activation_bytes = memory_stats(device).peak_of(MemoryCategory::activations) - before;
  return step;
}

void StepFigures::begin_step() { begin_ = std::chrono::steady_clock::now(); }

void StepFigures::end_step(std::int64_t step, const parallel::PipelineStep& result, double checked_ms) {
  if (step > 0 || steps_ == 1) {  // the first step warms up allocators
    pipeline_ms_ += result.step_ms;
    for (const auto& a : result.timeline) busy_ms_ += a.end_ms - a.begin_ms;
    whole_ms_ += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - begin_).count() - checked_ms;
  }
  peak_ = std::max(peak_, result.peak_activation_bytes);
  last_ = result.timeline;
}

void StepFigures::finish(GridRun& run, parallel::Topology& topology) const {
  // Each stage's figures, from its first TP rank of the first replica, gathered on every rank: [the rank
  // speaks for its stage (1 or 0), the stage, bubble, peak, then per action: op, micro-batch, chunk,
  // begin, end].
  const bool speaks = topology.tp_rank() == 0 && topology.dp_rank() == 0 && topology.cp_rank() == 0;
  std::vector<double> mine = {speaks ? 1.0 : 0.0, static_cast<double>(topology.pp_rank()),
                              pipeline_ms_ > 0 ? 1.0 - busy_ms_ / pipeline_ms_ : 0.0, static_cast<double>(peak_)};
  for (const auto& timed : last_)
    mine.insert(mine.end(), {static_cast<double>(static_cast<int>(timed.action.op)),  // forward, backward, weight
                             static_cast<double>(timed.action.micro_batch), static_cast<double>(timed.action.chunk),
                             timed.begin_ms, timed.end_ms});
  const auto all = comm::all_gather_values(topology.world(), mine);
  const double mean_ms = whole_ms_ / static_cast<double>(std::max<std::int64_t>(1, steps_ - 1));
  run.step_ms = comm::all_reduce_scalar(topology.world(), static_cast<float>(mean_ms), comm::ReduceOp::max);  // the slowest
  const auto p = static_cast<std::size_t>(topology.pp_size());
  run.bubble.assign(p, 0.0), run.peak_activations.assign(p, 0.0), run.timeline.assign(p, {});
  for (const auto& figures : all) {
    if (figures[0] == 0.0) continue;
    const auto s = static_cast<std::size_t>(figures[1]);
    run.bubble[s] = figures[2], run.peak_activations[s] = figures[3];
    for (std::size_t at = 4; at + 5 <= figures.size(); at += 5)
      run.timeline[s].push_back({{static_cast<parallel::PipeOp>(static_cast<int>(figures[at])), static_cast<int>(figures[at + 1]),
                                  static_cast<int>(figures[at + 2])},
                                 figures[at + 3], figures[at + 4]});
  }
}

}  // namespace course::chapter08
