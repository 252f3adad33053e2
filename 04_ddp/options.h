// Chapter 04's flags: the shared groups (common/cli) and the chapter's own.
#pragma once
#include "common/cli/forward.h"
#include <cstdint>
#include <string>

#include "common/cli/cli.h"
#include "common/cli/model_options.h"
#include "common/cli/precision_options.h"
#include "common/cli/training_options.h"

namespace course::chapter04 {

struct Options {
  cli::CommonOptions common;
  cli::DistributedOptions distributed;
  cli::TrainingOptions training;  // --steps 60, --global-batch 240, --lr 0.01
  cli::PrecisionOptions precision;  // --precision fp32|bf16|fp16
  cli::ModelOptions models;       // --model mlp|gpt, the GPT's sizes, --data
  cli::MlpOptions mlp;            // --samples, --features, --hidden, --layers
  int accum = 1;
  std::int64_t epochs = 0;
  int log_every = 10;
  bool verify = false, drift = false;
  cli::FaultOptions faults;  // --fault, --fault-from-step
  std::string save, init, optimizer = "sgd";
};

void add_options(CLI::App& app, Options& o);

}  // namespace course::chapter04
