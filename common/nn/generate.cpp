// Token generation.
#include "common/nn/generate.h"

#include <algorithm>
#include <cmath>

#include "common/autograd/autograd.h"
#include "common/tensor/random.h"

namespace course::nn {

Tensor generate(GPT& model, const Tensor& prompts, std::int64_t new_tokens, const Sampling& sampling) {
  autograd::NoGradGuard no_grad;
  const std::int64_t batch = prompts.dim(0), vocab = model.config().vocab_size;
  std::int64_t length = prompts.dim(1);
  std::vector<float> ids = prompts.to_host();
  for (std::int64_t step = 0; step < new_tokens; ++step) {
    const std::int64_t context = std::min(length, model.config().block_size);
    std::vector<float> window;
    for (std::int64_t b = 0; b < batch; ++b)
      window.insert(window.end(), ids.begin() + b * length + (length - context), ids.begin() + (b + 1) * length);
    const auto logits = model(Tensor::from_host(window, {batch, context}, prompts.device())).to_host();
    std::vector<float> next(static_cast<std::size_t>(batch));
    for (std::int64_t b = 0; b < batch; ++b) {
      const float* row = logits.data() + ((b + 1) * context - 1) * vocab;  // the last position's logits
      if (sampling.temperature <= 0.0f) {
        next[static_cast<std::size_t>(b)] = static_cast<float>(std::max_element(row, row + vocab) - row);
        continue;
      }
      std::vector<std::pair<float, std::int64_t>> ranked;
      for (std::int64_t v = 0; v < vocab; ++v) ranked.emplace_back(row[v] / sampling.temperature, v);
      std::sort(ranked.begin(), ranked.end(), [](const auto& x, const auto& y) { return x.first > y.first; });
      if (sampling.top_k > 0 && sampling.top_k < vocab) ranked.resize(static_cast<std::size_t>(sampling.top_k));
      double total = 0.0;
      for (const auto& r : ranked) total += std::exp(static_cast<double>(r.first - ranked[0].first));
      double u = random_uniform(sampling.seed, static_cast<std::uint64_t>(step * batch + b)) * total;
      std::int64_t choice = ranked.back().second;
      for (const auto& r : ranked) {
        u -= std::exp(static_cast<double>(r.first - ranked[0].first));
        if (u < 0) {
          choice = r.second;
          break;
        }
      }
      next[static_cast<std::size_t>(b)] = static_cast<float>(choice);
    }
    std::vector<float> longer;
    for (std::int64_t b = 0; b < batch; ++b) {
      longer.insert(longer.end(), ids.begin() + b * length, ids.begin() + (b + 1) * length);
      longer.push_back(next[static_cast<std::size_t>(b)]);
    }
    ids = std::move(longer);
    ++length;
  }
  return Tensor::from_host(ids, {batch, length}, prompts.device());
}

double addition_accuracy(GPT& model, const data::AdditionTask& task,
                         const std::vector<data::AdditionTask::Problem>& problems, Device device,
                         std::vector<std::string>* answers, std::int64_t batch) {
  if (problems.empty()) return 0.0;
  std::int64_t right = 0;
  const std::int64_t answer_length = task.digits() + 1;
  for (std::size_t start = 0; start < problems.size(); start += static_cast<std::size_t>(batch)) {
    std::vector<data::AdditionTask::Problem> part(
        problems.begin() + static_cast<std::ptrdiff_t>(start),
        problems.begin() +
            static_cast<std::ptrdiff_t>(std::min(problems.size(), start + static_cast<std::size_t>(batch))));
    const auto out = generate(model, task.prompts(part, device), answer_length).to_host();
    const std::int64_t width = task.prompt_length() + answer_length;
    for (std::size_t i = 0; i < part.size(); ++i) {
      std::string got;
      for (std::int64_t j = task.prompt_length(); j < width; ++j)
        got += data::AdditionTask::kVocabulary[static_cast<std::size_t>(
            out[i * static_cast<std::size_t>(width) + static_cast<std::size_t>(j)])];
      right += got == task.answer(part[i]);
      if (answers) answers->push_back(got);
    }
  }
  return static_cast<double>(right) / static_cast<double>(problems.size());
}

}  // namespace course::nn
