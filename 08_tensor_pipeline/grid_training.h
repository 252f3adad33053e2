// Training on the TP x PP x DP grid: the chapter's options, the optimizer, the model each rank holds,
// and one training run with what it measured.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/cli/cli.h"
#include "common/cli/model_options.h"
#include "common/metrics/metrics.h"
#include "common/nn/tasks.h"
#include "common/optim/lr_scheduler.h"
#include "common/optim/optimizer.h"
#include "common/parallel/ddp.h"
#include "common/parallel/pipeline.h"
#include "common/parallel/topology.h"
#include "common/verify/lockstep.h"

namespace course::chapter08 {

struct Options {
  cli::CommonOptions common;
  cli::DistributedOptions distributed;
  cli::ModelOptions models;
  std::int64_t hidden = 256;  // the MLP: as chapter 07's, 8 hidden layers of 256
  int layers = 8;
  int tp = 1, pp = 1, dp = 0;
  bool sequence_parallel = false;
  int micro_batches = 4;
  std::string schedule = "1f1b";
  std::int64_t steps = 20;
  std::int64_t global_batch = 48;
  float lr = 3e-3f;
  double clip = 1.0;  // the gradient's global norm, as GPT-2 (0: off)
  int log_every = 5;
  bool verify = false;
  bool sweep = false;         // both schedules at m = 1..16, with the charts
  std::string charts = "pipeline";
  std::string trace;          // the last step's timeline, Chrome trace JSON (and a PNG beside it)
  cli::FaultOptions faults;   // --fault, --fault-from-step
  std::string sim_network;    // ALPHA_US,GBPS: every message delayed as on that network
};

// What the chapter trains: the GPT on the addition task (`addition` set), or the house-price MLP.
struct ChapterTask {
  nn::TrainingTask task;
  std::shared_ptr<data::AdditionTask> addition;  // the GPT's data; null for the MLP
  nn::GPTConfig config;                          // the GPT's
  bool is_gpt() const { return addition != nullptr; }
  std::int64_t tokens_per_sample() const { return is_gpt() ? addition->sequence_length() : 1; }
};
ChapterTask make_task(const Options& o, Device device);

// AdamW as GPT-2 trains (betas 0.9, 0.95; decay on matrices and embeddings only) with warm-up and
// cosine decay; the gradient is clipped to --clip by the caller, who knows how it is split.
struct Trainer {
  std::unique_ptr<optim::Adam> adam;
  std::shared_ptr<optim::LRScheduler> schedule;
  Trainer(const std::vector<Tensor>& params, const Options& o);
  void step(std::int64_t step);
};

// One training run on the grid with `m` micro-batches and `schedule`, and what it measured: every
// step's loss (the global batch's), and for each stage (gathered on every rank) its bubble, its peak
// activations and the timeline of its last step.
struct GridRun {
  std::shared_ptr<parallel::TensorParallelModule> model;  // this rank's part of the model
  parallel::PipelineStageGPT* stage = nullptr;             // the same, for the GPT
  // With DP: the model wrapped in DDP on the DP group. Its gradient hooks stay on the model's
  // parameters, so it lives as long as the model does.
  std::unique_ptr<parallel::DistributedDataParallel> ddp;
  std::vector<float> losses;
  std::vector<double> bubble, peak_activations;  // per stage
  std::vector<std::vector<parallel::TimedAction>> timeline;  // per stage, the last step
  double step_ms = 0;  // the whole step (pipeline, DP average, update), the slowest rank's mean
  verify::LockstepSummary check;  // with --verify
};
// With `verified`, every step is checked in lock-step against the unsharded model (verify_grid.h).
GridRun train_grid(const Options& o, const ChapterTask& task, parallel::Topology& topology, Device device,
                   const std::string& schedule_name, int m, metrics::MetricsWriter* metrics, bool verified = false);

// Whether this rank's copy of parameter `name` is the one that counts in sums over the TP group and the
// pipeline (clipping's norm, the whole model of --verify): a part TP splits, on every TP rank; what TP
// keeps whole, on TP rank 0 only; the tied table, on the first stage only.
bool counts_once(const GridRun& run, parallel::Topology& topology, const std::string& name);

}  // namespace course::chapter08
