// Chapter 07's flags: the shared groups (common/cli) and the chapter's own.
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
#include "common/parallel/zero.h"

namespace course::chapter07 {

struct Options {
  cli::CommonOptions common;
  cli::DistributedOptions distributed;
  cli::TrainingOptions training;  // --steps 20, --global-batch 240, --lr 1e-3
  cli::ModelOptions models;       // --model mlp|gpt, the GPT's sizes, --data
  cli::MlpOptions mlp;            // 8 hidden layers of 256, so that model states dominate and units are small
  cli::PrecisionOptions precision;  // --precision fp32|bf16|fp16: 16-bit parameters and gradients over float32 masters
  int stage = 3;
  std::string offload = "none";  // ZeRO-Offload: none, optimizer, parameters (stage 3)
  int accum = 1;
  double clip = 1.0;
  int log_every = 5;
  bool verify = false, compare = false, prefetch = false;
  double mem_limit_mb = 0;
  cli::FaultOptions faults;      // --fault, --fault-from-step
  cli::KillOptions kill;         // --fail-at-step: a rank killed on purpose, in the checkpointed run
  cli::CheckpointOptions checkpoints;  // sharded, of the chosen stage's run: --ckpt-dir, --ckpt-every 10, --keep 2
  std::string save;              // the final parameters, consolidated into one ordinary file
  std::string consolidate;       // a step folder to consolidate into --save, without training
  std::string sim_network;       // ALPHA_US,GBPS
  std::string predict;           // --predict FILE: the cost model's step of each stage beside it (prediction.h)
};

void add_options(CLI::App& app, Options& o);
parallel::ZeroOptions::Offload offload_of(const Options& o);  // --offload
// What every stage's run shares: GPT-2's AdamW (optim::kGpt2AdamW) at --lr, clipped at --clip; --precision
// (16-bit parameters and gradients over float32 masters, K = 12) and fp16's --loss-scale; --offload
// (ZeRO-Offload: Adam's state and the masters in host memory, AdamW on the CPU). The stage is the caller's.
parallel::ZeroOptions zero_options(const Options& o);
// What the flags cannot check one by one, before and after the world is known; throws UsageError
// naming the flag.
void check_options(const Options& o);
void check_options(const Options& o, int ranks);

}  // namespace course::chapter07
