// The training flags and how the global batch meets the world size.
#include "common/cli/training_options.h"

#include <CLI/CLI.hpp>

#include "common/cli/cli.h"
#include "common/core/errors.h"
#include "common/core/log.h"

namespace course::cli {

CLI::Option* add_training_options(CLI::App& app, TrainingOptions& o, const std::string& lr_help) {
  auto* steps = app.add_option("--steps", o.steps, "Optimizer steps")
                    ->check(PositiveInteger & CLI::Range(std::int64_t{1}, kMaxSteps))
                    ->capture_default_str();
  app.add_option("--global-batch", o.global_batch,
                 "Samples per optimizer step over all ranks (the default is rounded up to a multiple of the ranks)")
      ->check(PositiveInteger & CLI::Range(std::int64_t{1}, kMaxGlobalBatch))
      ->each([&o](const std::string&) { o.global_batch_given = true; })
      ->capture_default_str();
  app.add_option("--lr", o.lr, lr_help)->check(PositiveFinite)->capture_default_str();
  return steps;
}

std::int64_t global_batch_for(const TrainingOptions& o, int ranks, int accum, std::int64_t dataset_size,
                              const std::string& ranks_name, const std::string& accum_flag) {
  const std::int64_t multiple = static_cast<std::int64_t>(ranks) * accum;
  std::int64_t batch = o.global_batch;
  if (batch % multiple != 0) {
    const std::string by = accum > 1 || ranks_name != "ranks"
                               ? ranks_name + " x " + accum_flag + " (" + std::to_string(ranks) + " x " + std::to_string(accum) + ")"
                               : std::to_string(ranks) + " ranks";
    if (o.global_batch_given)
      throw UsageError("--global-batch: " + std::to_string(batch) + " is not divisible by " + by);
    batch = (batch / multiple + 1) * multiple;
    log("global batch %lld: the default %lld rounded up to a multiple of %s\n", static_cast<long long>(batch),
        static_cast<long long>(o.global_batch), by.c_str());
  }
  if (batch > dataset_size)
    throw UsageError("--global-batch: " + std::to_string(batch) + " is more than the " + std::to_string(dataset_size) +
                     " samples of the dataset (--samples)");
  return batch;
}

}  // namespace course::cli
