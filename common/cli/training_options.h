// --steps, --global-batch and --lr: the training flags of every chapter that trains, one name and one
// bound each. The chapter sets its defaults in the struct before adding the flags.
#pragma once
#include "common/cli/forward.h"
#include <cstdint>
#include <string>

namespace course::cli {

// The most steps a run may take: a bound that keeps every step count exact in the metrics and turns a
// mistyped --epochs into an error instead of a run that never ends.
constexpr std::int64_t kMaxSteps = 10'000'000;
constexpr std::int64_t kMaxGlobalBatch = std::int64_t{1} << 24;

struct TrainingOptions {
  std::int64_t steps = 60;
  std::int64_t global_batch = 240;
  float lr = 0.01f;
  bool global_batch_given = false;
};

// Adds the three flags; `lr_help` says which optimizer's rate it is. Returns --steps (for --epochs to
// exclude it).
CLI::Option* add_training_options(CLI::App& app, TrainingOptions& options, const std::string& lr_help);

// The samples each rank takes per micro-batch times `accum`: the global batch over `ranks` x `accum`.
// A given --global-batch must divide evenly (refused naming the flag); the default is rounded up to the
// nearest multiple, so that the defaults run at any world size, and the log says so. Also refuses a
// global batch larger than the dataset's `dataset_size` samples. Returns the global batch to use.
// `ranks_name` and `accum_flag` name the two factors in the messages (08: "DP" replicas, each in
// --micro-batches).
std::int64_t global_batch_for(const TrainingOptions& options, int ranks, int accum, std::int64_t dataset_size,
                              const std::string& ranks_name = "ranks", const std::string& accum_flag = "--accum");

}  // namespace course::cli
