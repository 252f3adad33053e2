// --model mlp|gpt and the GPT's flags, shared by every chapter that trains either model: the flags are
// declared once, and the task is built once, with each impossible size named by its flag.
#pragma once
#include "common/cli/forward.h"
#include <cstdint>
#include <string>

#include "common/comm/communicator.h"
#include "common/metrics/metrics.h"
#include "common/nn/tasks.h"

namespace course::cli {

struct ModelOptions {
  std::string model = "mlp";                 // --model
  nn::GPTConfig gpt{2, 4, 64, 0, 12, 0.0f};  // --n-layer, --n-head, --n-embd, --block-size (0: the data's)
  int digits = 2;                            // --digits: the addition task's
  std::string data;                          // --data FILE: character-level text instead of addition
  double val_fraction = 0.1;                 // --val-fraction
  std::string recompute = "none";            // --recompute, where a chapter offers it (gpt.recompute follows)
};
void add_model_options(CLI::App& app, ModelOptions& options);
// --recompute none|selective|full (04, 07, 08): what the GPT's blocks keep for backward
// (nn::Recompute); the MLP refuses anything but none.
void add_recompute_option(CLI::App& app, ModelOptions& options);
// Throws UsageError naming --recompute when it is given for the MLP.
void check_recompute(const ModelOptions& options);

// The MLP's sizes (--samples, --features, --hidden, --layers): one name and one bound each, in every
// chapter that trains the MLP. The chapter sets its defaults in the struct before adding the flags.
struct MlpOptions {
  std::int64_t samples = 8192, features = 16, hidden = 256;
  int layers = 2;
  bool samples_given = false;  // --samples was given (the GPT then takes it as its number of problems)
};
void add_mlp_options(CLI::App& app, MlpOptions& options);

// The task of --model: the MLP of `mlp`'s sizes on the house-price data, or the GPT on addition or
// --data. Refuses --data with the MLP, and an MLP whose training (`copies` of it: 2 with a reference
// beside the run) would not fit this machine's memory beside `ranks_here` others, naming the flags.
nn::TrainingTask training_task(const ModelOptions& models, const MlpOptions& mlp, std::int64_t global_batch,
                               int copies, int ranks_here, Device device, std::uint64_t seed);

// The GPT's task (the MLP's is the chapter's own, with its own sizes). `samples` is the chapter's
// --samples, used as the number of training problems when `samples_given`; otherwise 4000 problems
// (fewer for one digit), with 500 more held out. Throws UsageError naming the flag at fault.
nn::TrainingTask gpt_training_task(const ModelOptions& options, std::int64_t samples, bool samples_given, Device device,
                                   std::uint64_t seed);
// The addition task itself, for a chapter that feeds the GPT its batches by hand (08's pipeline takes
// ids and targets, micro-batch by micro-batch). The same sizes and checks as gpt_training_task.
nn::GptTask gpt_addition_task(const ModelOptions& options, std::int64_t samples, bool samples_given, Device device,
                              std::uint64_t seed);

// The GPT on --data's text, for a chapter that feeds it batches by hand (08), with the same checks as
// gpt_training_task.
nn::GptTextTask gpt_text_task(const ModelOptions& options, Device device);

// What the trained model can do, where its task can say (the GPT's held-out accuracy and a few of its
// answers): rank 0 evaluates, logs one line and writes an "evaluation" metric; the others go on.
void report_evaluation(const nn::TrainingTask& task, nn::Module& model, comm::Communicator& group,
                       metrics::MetricsWriter& metrics);

}  // namespace course::cli
