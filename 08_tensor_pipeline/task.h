// What chapter 08 trains and how a step's data is cut: the task (the GPT on additions or on --data's text,
// or the house-price MLP), the global batch cut into a replica's micro-batches, and their weights. Every
// lesson file uses it (tensor_parallel.cpp, pipeline.cpp, context_parallel.cpp, grid.cpp).
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "08_tensor_pipeline/options.h"
#include "common/data/addition.h"
#include "common/data/text.h"
#include "common/nn/gpt.h"
#include "common/nn/tasks.h"

namespace course::chapter08 {

// What the chapter trains: the GPT on the addition task (`addition` set) or on --data's text (`text`
// set: a long context), or the house-price MLP.
struct ChapterTask {
  nn::TrainingTask task;
  std::shared_ptr<data::AdditionTask> addition;  // the GPT's problems, or
  std::shared_ptr<data::CharText> text;          // its text (--data); both null for the MLP
  nn::GPTConfig config;                          // the GPT's
  // With context parallelism, each problem padded at its end to a length the ranks can split
  // (parallel::context_parallel_length; its block_size covers it); otherwise the sample's length.
  std::int64_t sequence = 0;
  bool is_gpt() const { return addition || text; }
  std::int64_t tokens_per_sample() const {
    return addition ? addition->sequence_length() : text ? text->block_size() : 1;
  }
  // The GPT's micro-batch of these training samples: ids [B, sequence], targets [B * sequence], the
  // padding's targets ignored.
  data::AdditionTask::Batch batch(const std::vector<std::int64_t>& part, Device device) const;
};
ChapterTask make_task(const Options& o, Device device);


// Replica `replica`'s share of a whole global batch (`batch`, the stream's next) of `replicas`, in `m`
// micro-batches.
std::vector<std::vector<std::int64_t>> micro_batches(const std::vector<std::int64_t>& batch, int replica, int replicas,
                                                     int m);
// Each micro-batch's weight in its replica's mean loss: the GPT's share of counted targets
// (parallel::micro_batch_weights), the MLP's 1/m (equal sizes).
std::vector<float> micro_batch_weights(const ChapterTask& task, const std::vector<std::vector<std::int64_t>>& parts,
                                       Device device);
// The micro-batches the run's step takes: all of them (--fault lose-micro-batch leaves the last out; the
// reference never comes here).
std::vector<std::vector<std::int64_t>> run_parts(std::vector<std::vector<std::int64_t>> parts);

}  // namespace course::chapter08
