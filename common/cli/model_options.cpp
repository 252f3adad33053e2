// The model flags and the GPT's task.
#include "common/cli/model_options.h"

#include <CLI/CLI.hpp>

#include <algorithm>

#include "common/cli/cli.h"
#include "common/cli/limits.h"
#include "common/core/errors.h"
#include "common/core/log.h"
#include "common/parallel/replicas.h"

namespace course::cli {
namespace {
constexpr std::int64_t kHeldOutProblems = 500;  // the addition task's held-out problems, at most
constexpr std::int64_t kGptProblems = 4000;     // training problems unless --samples says otherwise
}  // namespace

void add_model_options(CLI::App& app, ModelOptions& o) {
  app.add_option("--model", o.model, "mlp: the house-price MLP; gpt: a GPT learning integer addition (or --data)")
      ->check(CLI::IsMember({"mlp", "gpt"}))
      ->capture_default_str();
  app.add_option("--n-layer", o.gpt.n_layer, "GPT blocks")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{64}))
      ->capture_default_str();
  app.add_option("--n-head", o.gpt.n_head, "GPT attention heads (must divide --n-embd)")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{256}))
      ->capture_default_str();
  app.add_option("--n-embd", o.gpt.n_embd, "GPT width")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 14))
      ->capture_default_str();
  app.add_option("--block-size", o.gpt.block_size,
                 "GPT context length (default: the problem's length, or 32 for --data)")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 16));
  app.add_option("--digits", o.digits, "Digits of each addend (GPT)")->check(CLI::Range(1, 9))->capture_default_str();
  app.add_option("--data", o.data, "With --model gpt: train on the characters of this text file instead of addition")
      ->check(InputFile);
  app.add_option("--val-fraction", o.val_fraction, "The share of --data held out for validation")
      ->check(CLI::Range(0.001, 0.999))
      ->capture_default_str();
}

void add_mlp_options(CLI::App& app, MlpOptions& o) {
  app.add_option("--samples", o.samples, "Dataset size (for the GPT: training problems)")
      ->check(PositiveInteger & CLI::Range(std::int64_t{1}, std::int64_t{1} << 24))
      ->each([&o](const std::string&) { o.samples_given = true; })
      ->capture_default_str();
  app.add_option("--features", o.features, "Input features (MLP)")
      ->check(CLI::Range(std::int64_t{2}, std::int64_t{1} << 16))
      ->capture_default_str();
  app.add_option("--hidden", o.hidden, "Hidden width (MLP)")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 14))
      ->capture_default_str();
  app.add_option("--layers", o.layers, "Hidden layers (MLP)")->check(CLI::Range(1, 64))->capture_default_str();
}

void add_recompute_option(CLI::App& app, ModelOptions& o) {
  app.add_option_function<std::string>(
         "--recompute",
         [&o](const std::string& value) {
           o.recompute = value;
           o.gpt.recompute = nn::recompute_named(value);
         },
         "GPT: what backward keeps (activation recomputation): none; selective, attention's probabilities "
         "computed again in backward; full, each block's input only, the block run again in backward")
      ->check(CLI::IsMember({"none", "selective", "full"}))
      ->default_str("none");
}

void check_recompute(const ModelOptions& o) {
  if (o.recompute != "none" && o.model != "gpt")
    throw UsageError("--recompute: recomputes the GPT's blocks (--model gpt); the MLP keeps its activations");
}

nn::TrainingTask training_task(const ModelOptions& models, const MlpOptions& mlp, std::int64_t global_batch,
                               int copies, int ranks_here, Device device, std::uint64_t seed) {
  if (!models.data.empty() && models.model != "gpt") throw UsageError("--data: a text file is for --model gpt");
  check_recompute(models);
  if (models.model == "gpt") return gpt_training_task(models, mlp.samples, mlp.samples_given, device, seed);
  check_memory(copies * mlp_training_bytes(mlp.samples, mlp.features, mlp.hidden, mlp.layers, global_batch),
               "--samples " + std::to_string(mlp.samples) + ", --hidden " + std::to_string(mlp.hidden) +
                   ", --layers " + std::to_string(mlp.layers) + " and --global-batch",
               ranks_here);
  return nn::mlp_task(mlp.samples, mlp.features, mlp.hidden, mlp.layers, device, seed);
}

nn::TrainingTask gpt_training_task(const ModelOptions& o, std::int64_t samples, bool samples_given, Device device,
                                   std::uint64_t seed) {
  if (o.gpt.n_embd % o.gpt.n_head != 0)
    throw UsageError("--n-head: " + std::to_string(o.gpt.n_head) + " does not divide --n-embd " +
                     std::to_string(o.gpt.n_embd));
  if (!o.data.empty()) return gpt_text_task(o, device).task;
  return gpt_addition_task(o, samples, samples_given, device, seed).task;
}

nn::GptTextTask gpt_text_task(const ModelOptions& o, Device device) {
  if (o.gpt.n_embd % o.gpt.n_head != 0)
    throw UsageError("--n-head: " + std::to_string(o.gpt.n_head) + " does not divide --n-embd " +
                     std::to_string(o.gpt.n_embd));
  try {
    return nn::gpt_text_task(o.gpt, o.data, o.val_fraction, device);
  } catch (const UsageError& e) {
    throw UsageError(std::string("--data: ") + e.what());
  }
}

nn::GptTask gpt_addition_task(const ModelOptions& o, std::int64_t samples, bool samples_given, Device device,
                              std::uint64_t seed) {
  if (o.gpt.n_embd % o.gpt.n_head != 0)
    throw UsageError("--n-head: " + std::to_string(o.gpt.n_head) + " does not divide --n-embd " +
                     std::to_string(o.gpt.n_embd));
  if (o.gpt.block_size != 0 && o.gpt.block_size < 3 * o.digits + 2)
    throw UsageError("--block-size: " + std::to_string(o.gpt.block_size) + " is shorter than the " +
                     std::to_string(3 * o.digits + 2) + " tokens of a problem of --digits " + std::to_string(o.digits));
  std::int64_t possible = 1;
  for (int i = 0; i < 2 * o.digits; ++i) possible *= 10;
  // At most half of all problems are used, so that drawing distinct ones stays quick; at most a tenth
  // of them is held out.
  const std::int64_t held_out = std::min(kHeldOutProblems, possible / 10);
  const std::int64_t problems = samples_given ? samples : std::min(kGptProblems, possible / 2 - held_out);
  if (problems + held_out > possible / 2)
    throw UsageError("--samples: " + std::to_string(problems) + " problems and " + std::to_string(held_out) +
                     " held out are more than half of the " + std::to_string(possible) + " problems of --digits " +
                     std::to_string(o.digits));
  return nn::gpt_task(o.gpt, o.digits, problems, held_out, device, seed);
}

void report_evaluation(const nn::TrainingTask& task, nn::Module& model, comm::Communicator& group,
                       metrics::MetricsWriter& metrics) {
  if (!task.evaluate) return;
  parallel::on_rank0(group, [&] {
    const auto e = task.evaluate(model);
    std::string shown;
    for (const auto& example : e.examples) shown += (shown.empty() ? "" : ", ") + example;
    log("%s: %.3f; for example %s\n", e.metric.c_str(), e.value, shown.c_str());
    metrics.write({{"event", "evaluation"}, {"metric", e.metric}, {"value", e.value}, {"examples", e.examples}});
  });
}

}  // namespace course::cli
