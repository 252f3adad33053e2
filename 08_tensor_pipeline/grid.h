// Lesson 4, the 3D grid: TP x CP x PP x DP at once, as Megatron-LM arranges them. The topology
// (common/parallel/topology.h) owns the grid; nothing here computes a rank. Every rank makes the whole
// model from the same seed and keeps its part: its stage's layers (lesson 2), each split across its TP
// group (lesson 1), attention through its CP group (lesson 3); data parallelism runs copies of the whole
// arrangement and averages their gradients over the DP group with the CP ranks (chapters 04-05's DDP).
// main.cpp's train_grid is the step on it.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "08_tensor_pipeline/options.h"
#include "08_tensor_pipeline/task.h"
#include "common/faults/faults.h"
#include "common/parallel/context_parallel.h"
#include "common/parallel/ddp.h"
#include "common/parallel/pipeline.h"
#include "common/parallel/pipeline_schedule.h"
#include "common/parallel/tensor_parallel.h"
#include "common/parallel/topology.h"
#include "common/verify/lockstep.h"

namespace course::chapter08 {

// One training run on the grid with `m` micro-batches and `schedule`, and what it measured: every
// step's loss (the global batch's), and for each stage (gathered on every rank) its bubble, its peak
// activations and the timeline of its last step.
struct GridRun {
  // With --cp: the context-parallel group's attention, which the model's blocks call (made first, so it
  // outlives them).
  std::unique_ptr<parallel::ContextParallel> cp;
  std::shared_ptr<parallel::TensorParallelModule> model;  // this rank's part of the model
  parallel::PipelineStageGPT* stage = nullptr;             // the same, for the GPT
  // With DP: the model wrapped in DDP on the DP group, or with interleaved stages each chunk in its own
  // (as Megatron-LM wraps each virtual stage). Their gradient hooks stay on the model's parameters, so
  // they live as long as the model does.
  std::vector<std::unique_ptr<parallel::DistributedDataParallel>> ddp;
  std::unique_ptr<comm::Communicator> faulty_tp;  // --fault skip-tp-all-reduce: the layers' TP group
  faults::Installation faults_installed;          // --fault: the run's objects it acts on, its step-end hook
  std::vector<float> losses;
  std::vector<double> bubble, peak_activations;  // per stage
  std::vector<parallel::StageTimes> work;        // per stage: its passes' time in a step (ms, the mean after the first)
  std::vector<std::vector<parallel::TimedAction>> timeline;  // per stage, the last step
  double step_ms = 0;  // the whole step (pipeline, DP average, update), the slowest rank's mean
  std::int64_t cp_bytes = 0;  // with --cp: what attention handed the CP group per step (this rank, the mean)
  std::int64_t skipped_steps = 0;  // fp16: steps whose gradients overflowed somewhere in the grid
  verify::LockstepSummary check;  // with --verify
};

// This rank's part of the model, made alike on every rank from the seed: its stage's layers (all of
// them when --pp is 1), each split across its TP group; with DP, wrapped in chapter 04/05's DDP on the
// DP group. --fault is installed here, on the run's own objects (common/faults/faults.h).
GridRun make_grid_model(const Options& o, const ChapterTask& task, parallel::Topology& topology, Device device);

// --fault stray-moment acts on the run's optimizer, which the lesson makes after the grid: --verify's
// check (the only kind of run a fault is allowed in) installs it, for as long as the result lives.
faults::Installation install_optimizer_faults(const GridRun& run, parallel::Topology& topology,
                                              const optim::Optimizer& optimizer);

}  // namespace course::chapter08
