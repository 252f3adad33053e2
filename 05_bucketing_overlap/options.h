// Chapter 05's flags: the shared groups (common/cli) and the chapter's own.
#pragma once
#include "common/cli/forward.h"
#include <string>

#include "common/cli/cli.h"
#include "common/cli/model_options.h"
#include "common/cli/precision_options.h"
#include "common/cli/training_options.h"

namespace course::chapter05 {

struct Options {
  cli::CommonOptions common;
  cli::DistributedOptions distributed;
  cli::TrainingOptions training;  // --steps 8, --global-batch 128, --lr 0.001
  cli::PrecisionOptions precision;  // --precision fp32|bf16|fp16
  cli::ModelOptions models;       // --model mlp|gpt, the GPT's sizes, --data
  cli::MlpOptions mlp;            // --samples 4096, --features 64, --hidden 1024, --layers 8
  double bucket_mb = 2, first_bucket_mb = 1;  // 2 MB suits this 30 MB model (PyTorch's 25 MB, models of GBs)
  std::string sim_network, trace, comm_hook = "none";  // no trace unless asked: nothing lands in the current folder
  std::string save;
  std::string predict;  // --predict FILE: the cost model's price of each mode beside it (prediction.h)
  bool sweep_buckets = false, verify = false;
  cli::FaultOptions faults;                   // --fault, --fault-from-step
};

void add_options(CLI::App& app, Options& o);
// What the flags cannot check one by one; throws UsageError naming the flag.
void check_options(const Options& o);

}  // namespace course::chapter05
