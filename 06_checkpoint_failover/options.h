// Chapter 06's flags: the shared groups (common/cli) and the chapter's own.
#pragma once
#include "common/cli/forward.h"
#include <cstdint>
#include <string>

#include "common/cli/checkpoint_options.h"
#include "common/cli/cli.h"
#include "common/cli/kill_options.h"
#include "common/cli/model_options.h"
#include "common/cli/precision_options.h"
#include "common/cli/training_options.h"

namespace course::chapter06 {

struct Options {
  cli::CommonOptions common;
  cli::DistributedOptions distributed;
  cli::TrainingOptions training;  // --steps 200, --global-batch 240, --lr 1e-3
  cli::PrecisionOptions precision;  // --precision fp32|bf16|fp16
  cli::ModelOptions models;       // --model mlp|gpt, the GPT's sizes, --data
  cli::MlpOptions mlp;            // --samples, --features, --hidden, --layers
  cli::CheckpointOptions checkpoints;  // --ckpt-dir (required), --ckpt-every 20, --keep 3, --resume
  int log_every = 20;
  cli::KillOptions kill;  // --fail-at-step, --fail-rank, --fail-during-save
  bool verify = false;
  cli::FaultOptions faults;       // --fault, --fault-from-step
  bool fault_step_given = false;  // without --fault-from-step the fault breaks the resume itself
  std::string save;
  double mtbf_hours = 24;
};

void add_options(CLI::App& app, Options& o);
// What the flags cannot check one by one (after parsing); throws UsageError naming the flag.
void check_options(const CLI::App& app, Options& o);

// The MLP trains with Adam at a constant rate; the GPT as GPT-2 did (optim::Recipe "adamw"), whose rate
// follows a schedule over --steps.
std::string recipe_of(const Options& o);

}  // namespace course::chapter06
