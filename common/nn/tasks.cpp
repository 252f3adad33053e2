// The two tasks.
#include "common/nn/tasks.h"

#include "common/autograd/autograd.h"
#include "common/core/errors.h"
#include "common/nn/generate.h"
#include "common/ops/ops.h"

namespace course::nn {
namespace {
// ", full recomputation" in a task's description when the blocks recompute (nn::Recompute).
std::string recompute_note(const GPTConfig& config) {
  if (config.recompute == Recompute::selective) return ", selective recomputation";
  if (config.recompute == Recompute::full) return ", full recomputation";
  return "";
}
}  // namespace

TrainingTask mlp_task(std::int64_t samples, std::int64_t features, std::int64_t hidden, int layers, Device device,
                      std::uint64_t seed, Activation activation) {
  auto dataset = std::make_shared<data::Dataset>(data::make_house_prices_wide(samples, features, seed));
  TrainingTask t;
  t.name = "mlp";
  t.size = dataset->size;
  t.make_model = [=](std::uint64_t model_seed) -> std::shared_ptr<Module> {
    return make_mlp(features, hidden, layers, 1, activation, device, model_seed);
  };
  t.loss = [dataset, device](Module& model, const std::vector<std::int64_t>& indices) {
    data::Batch batch = data::make_batch(*dataset, indices, device);
    return mse_loss(model(batch.x), batch.y);
  };
  const auto params = make_mlp(features, hidden, layers, 1, activation, Device::cpu, 0)->parameter_count();
  t.description = std::string("MLP ") + (activation == Activation::relu ? "" : "(GELU) ") + std::to_string(params) +
                  " params on " + std::to_string(samples) + " house prices";
  return t;
}

GptTask gpt_task(GPTConfig config, int digits, std::int64_t problems, std::int64_t test_problems, Device device,
                 std::uint64_t seed) {
  auto data = std::make_shared<data::AdditionTask>(digits, problems, test_problems, seed);
  if (config.block_size == 0) config.block_size = data->sequence_length();
  if (config.block_size < data->sequence_length())
    throw UsageError("block_size " + std::to_string(config.block_size) + " is shorter than the " +
                     std::to_string(data->sequence_length()) + " tokens of a " + std::to_string(digits) +
                     "-digit problem");
  config.vocab_size = data->vocab_size();
  config.check();
  TrainingTask t;
  t.name = "gpt";
  t.size = static_cast<std::int64_t>(data->train().size());
  t.make_model = [=](std::uint64_t model_seed) -> std::shared_ptr<Module> {
    return std::make_shared<GPT>(config, device, model_seed);
  };
  // Every problem has the same number of answer tokens, so the mean over a batch's tokens is the mean
  // of its problems' means: shares and micro-batches combine exactly as they do for the MLP.
  t.loss = [data, device](Module& model, const std::vector<std::int64_t>& indices) {
    auto batch = data->batch(indices, device);
    return cross_entropy(model(batch.ids), batch.targets, data::AdditionTask::kIgnore);
  };
  t.evaluate = [data, device](Module& model) {
    auto& gpt = dynamic_cast<GPT&>(model);
    std::vector<std::string> answers;
    TrainingTask::Evaluation e{
        "held-out exact match", addition_accuracy(gpt, *data, data->test(), device, &answers), {}};
    for (std::size_t i = 0; i < answers.size() && i < 6; ++i) {
      const auto& p = data->test()[i];
      std::string digits(answers[i].rbegin(), answers[i].rend());                   // the model writes the sum reversed
      digits.erase(0, std::min(digits.find_first_not_of('0'), digits.size() - 1));  // "072" reads as 72
      e.examples.push_back(std::to_string(p.a) + "+" + std::to_string(p.b) + "=" + digits +
                           (answers[i] == data->answer(p) ? "" : " (wrong)"));
    }
    return e;
  };
  const auto params = GPT(config, Device::cpu, 0).parameter_count();
  t.description = "GPT " + std::to_string(config.n_layer) + " layers x " + std::to_string(config.n_head) + " heads x " +
                  std::to_string(config.n_embd) + " (" + std::to_string(params) + " params) on " +
                  std::to_string(problems) + " " + std::to_string(digits) + "-digit additions" + recompute_note(config);
  return {t, data, config};
}

GptTextTask gpt_text_task(GPTConfig config, const std::string& path, double val_fraction, Device device) {
  if (config.block_size == 0) config.block_size = 32;
  auto text = std::make_shared<data::CharText>(path, config.block_size, val_fraction);
  config.vocab_size = text->vocab_size();
  config.check();
  TrainingTask t;
  t.name = "gpt";
  t.size = text->train_windows();
  t.make_model = [=](std::uint64_t model_seed) -> std::shared_ptr<Module> {
    return std::make_shared<GPT>(config, device, model_seed);
  };
  t.loss = [text, device](Module& model, const std::vector<std::int64_t>& windows) {
    auto batch = text->batch(windows, device);
    return cross_entropy(model(batch.ids), batch.targets);
  };
  t.evaluate = [text, device, config](Module& model) {
    autograd::NoGradGuard no_grad;
    auto& gpt = dynamic_cast<GPT&>(model);
    // The validation loss over up to 64 windows spread across the held-out text.
    std::vector<std::int64_t> windows;
    const std::int64_t count = text->validation_windows();
    for (std::int64_t i = 0; i < std::min<std::int64_t>(64, count); ++i)
      windows.push_back(i * count / std::min<std::int64_t>(64, count));
    auto batch = text->batch(windows, device, true);
    TrainingTask::Evaluation e{"validation loss", cross_entropy(model(batch.ids), batch.targets).item(), {}};
    // A passage: the held-out text's first block, continued by sampling (temperature 0.8, top-k 10).
    const std::string prompt = text->validation_text().substr(0, static_cast<std::size_t>(config.block_size));
    Tensor ids = Tensor::from_host(text->encode(prompt), {1, config.block_size}, device);
    e.examples.push_back(text->decode(generate(gpt, ids, 80, {0.8f, 10, 1}).to_host()));
    return e;
  };
  const auto params = GPT(config, Device::cpu, 0).parameter_count();
  t.description = "GPT " + std::to_string(config.n_layer) + " layers x " + std::to_string(config.n_head) + " heads x " +
                  std::to_string(config.n_embd) + " (" + std::to_string(params) + " params) on " +
                  std::to_string(text->train_windows()) + " windows of " + path + recompute_note(config);
  return {t, text, config};
}

}  // namespace course::nn
