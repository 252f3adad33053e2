// Chapter 08's flags (the shared groups of common/cli and the grid's own), and what the grid and the
// model must satisfy together.
#pragma once
#include "common/cli/forward.h"
#include <cstdint>
#include <string>

#include "common/cli/cli.h"
#include "common/cli/model_options.h"
#include "common/cli/precision_options.h"
#include "common/cli/training_options.h"
#include "common/parallel/topology.h"

namespace course::chapter08 {

struct Options {
  cli::CommonOptions common;
  cli::DistributedOptions distributed;
  cli::ModelOptions models;
  cli::TrainingOptions training;  // --steps 20, --global-batch 48, --lr 3e-3 (AdamW's peak)
  cli::MlpOptions mlp;            // the MLP: as chapter 07's, 8 hidden layers of 256
  cli::PrecisionOptions precision;  // --precision fp32|bf16|fp16: the forward under autocast, float32 masters
  int tp = 1, pp = 1, dp = 0;
  int cp = 1;                      // context-parallel ranks: each sequence split across them
  std::string cp_method = "ring";  // ulysses | ring (common/parallel/context_parallel.h)
  bool sequence_parallel = false;
  int micro_batches = 4;
  std::string schedule = "1f1b";
  int virtual_stages = 1;  // model chunks per pipeline rank (interleaved 1F1B)
  double clip = 1.0;  // the gradient's global norm, as GPT-2 (0: off)
  int log_every = 5;
  bool verify = false;
  bool sweep = false;         // both schedules at m = 1..16, their bubbles and activations as metrics
  std::string trace;          // the last step's timeline, Chrome trace JSON (with --sweep: each schedule's)
  cli::FaultOptions faults;   // --fault, --fault-from-step
  std::string sim_network;    // ALPHA_US,GBPS: every message delayed as on that network
  double mem_limit_mb = 0;    // a budget per rank on the counted memory (what a long context needs)
};

void add_options(CLI::App& app, Options& o);

struct ChapterTask;
// The grid and the model must fit each other; each mismatch is one line naming the flag. Returns the
// global batch to use (the default rounded up to a multiple of DP x --micro-batches).
std::int64_t check_grid(const Options& o, const ChapterTask& task, parallel::Topology& topology);

}  // namespace course::chapter08
