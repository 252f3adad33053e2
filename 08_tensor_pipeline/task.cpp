// The chapter's task and a step's micro-batches.
#include "08_tensor_pipeline/task.h"

#include "08_tensor_pipeline/context_parallel.h"  // context_parallel_sequence, padded
#include "common/cli/model_options.h"
#include "common/faults/faults.h"
#include "common/parallel/distributed_sampler.h"  // share_of: each DP replica's share of it
#include "common/parallel/pipeline.h"             // micro_batch_weights over targets

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
    t.sequence = context_parallel_sequence(o, t.sequence);
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
  return padded(addition->batch(part, device), addition->sequence_length(), sequence);
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

// ---------------------------------------------------------------------------------------------------
// Below: --fault lose-micro-batch.

std::vector<std::vector<std::int64_t>> run_parts(std::vector<std::vector<std::int64_t>> parts) {
  if (faults::active("lose-micro-batch")) parts.pop_back();
  return parts;
}

}  // namespace course::chapter08
