// Lesson 3: context parallelism, the chapter's side (the attention itself: common/parallel/context_parallel.cpp).
#include "08_tensor_pipeline/context_parallel.h"

#include <vector>

namespace course::chapter08 {

std::int64_t context_parallel_sequence(const Options& o, std::int64_t length) {
  return parallel::context_parallel_length(length, o.cp, parallel::parse_context_method(o.cp_method));
}

data::AdditionTask::Batch padded(const data::AdditionTask::Batch& batch, std::int64_t length, std::int64_t sequence) {
  if (sequence == length) return batch;
  const Device device = batch.ids.device();
  const std::int64_t n = batch.ids.dim(0);
  const auto ids = batch.ids.to_host(), targets = batch.targets.to_host();
  std::vector<float> padded_ids(static_cast<std::size_t>(n * sequence), 0.0f),
      padded_targets(static_cast<std::size_t>(n * sequence), static_cast<float>(data::AdditionTask::kIgnore));
  for (std::int64_t s = 0; s < n; ++s)
    for (std::int64_t i = 0; i < length; ++i) {
      padded_ids[static_cast<std::size_t>(s * sequence + i)] = ids[static_cast<std::size_t>(s * length + i)];
      padded_targets[static_cast<std::size_t>(s * sequence + i)] = targets[static_cast<std::size_t>(s * length + i)];
    }
  return {Tensor::from_host(padded_ids, {n, sequence}, device), Tensor::from_host(padded_targets, {n * sequence}, device)};
}

std::unique_ptr<parallel::ContextParallel> make_context_parallel(const Options& o, bool gpt, parallel::Topology& topology) {
  if (!gpt || topology.cp_size() == 1) return nullptr;
  return std::make_unique<parallel::ContextParallel>(topology.cp_group(), parallel::parse_context_method(o.cp_method));
}

}  // namespace course::chapter08
