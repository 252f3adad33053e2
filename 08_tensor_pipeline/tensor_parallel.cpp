// Lesson 1: tensor and sequence parallelism, the chapter's side (the layers: common/parallel/tensor_parallel*.cpp).
#include "08_tensor_pipeline/tensor_parallel.h"

#include <chrono>
#include <optional>

#include "common/core/memory.h"                   // peak activations
#include "common/ops/ops.h"
#include "common/optim/optimizer.h"       // clip_grad_norm_ over groups
#include "common/parallel/tensor_parallel_gpt.h"
#include "common/parallel/tensor_parallel_mlp.h"

namespace course::chapter08 {

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

}  // namespace course::chapter08
