// Generating tokens with a trained GPT: greedy (temperature 0) or sampled with a temperature and
// top-k, as nanoGPT's generate. Each new token is the model's choice at the last position, appended.
#pragma once
#include <cstdint>

#include "common/data/addition.h"
#include "common/nn/gpt.h"

namespace course::nn {

struct Sampling {
  float temperature = 0.0f;  // 0: greedy (argmax)
  int top_k = 0;             // 0: all tokens
  std::uint64_t seed = 0;
};

// prompts: [B, T] ids; returns [B, T + new_tokens]. Sequences longer than block_size keep their last
// block_size tokens as context. No gradients are recorded.
Tensor generate(GPT& model, const Tensor& prompts, std::int64_t new_tokens, const Sampling& sampling = {});

// Exact-match accuracy on the addition task: the greedy answer to each problem, compared whole, in
// batches of `batch` problems. Returns the fraction right; `answers`, when given, receives each answer.
double addition_accuracy(GPT& model, const data::AdditionTask& task,
                         const std::vector<data::AdditionTask::Problem>& problems, Device device,
                         std::vector<std::string>* answers = nullptr, std::int64_t batch = 256);

}  // namespace course::nn
