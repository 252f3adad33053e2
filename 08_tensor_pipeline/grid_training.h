// The parts of chapter 08's training step (main.cpp puts them in order): the model each rank holds and
// its DDP, the micro-batches, forward and backward with or without a pipeline, clipping across the
// grid, the optimizer, and what a run measured.
#pragma once
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "08_tensor_pipeline/options.h"
#include "common/metrics/metrics.h"
#include "common/nn/tasks.h"
#include "common/optim/recipe.h"
#include "common/parallel/context_parallel.h"
#include "common/parallel/ddp.h"
#include "common/faults/faults.h"
#include "common/parallel/pipeline.h"
#include "common/parallel/topology.h"
#include "common/verify/lockstep.h"

namespace course::chapter08 {

// What the chapter trains: the GPT on the addition task (`addition` set) or on --data's text (`text`
// set: a long context), or the house-price MLP.
struct ChapterTask {
  nn::TrainingTask task;
  std::shared_ptr<data::AdditionTask> addition;  // the GPT's problems, or
  std::shared_ptr<data::CharText> text;          // its text (--data); both null for the MLP
  nn::GPTConfig config;                          // the GPT's
  // With context parallelism, each problem padded at its end to a length the ranks can split
  // (parallel::context_parallel_length; its block_size covers it); otherwise the sample's length.
  std::int64_t sequence = 0;
  bool is_gpt() const { return addition || text; }
  std::int64_t tokens_per_sample() const {
    return addition ? addition->sequence_length() : text ? text->block_size() : 1;
  }
  // The GPT's micro-batch of these training samples: ids [B, sequence], targets [B * sequence], the
  // padding's targets ignored.
  data::AdditionTask::Batch batch(const std::vector<std::int64_t>& part, Device device) const;
};
ChapterTask make_task(const Options& o, Device device);


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
  std::vector<std::vector<parallel::TimedAction>> timeline;  // per stage, the last step
  double step_ms = 0;  // the whole step (pipeline, DP average, update), the slowest rank's mean
  std::int64_t cp_bytes = 0;  // with --cp: what attention handed the CP group per step (this rank, the mean)
  std::int64_t skipped_steps = 0;  // fp16: steps whose gradients overflowed somewhere in the grid
  verify::LockstepSummary check;  // with --verify
};
// A part of the model made from the seed: the GPT's stage `pp.rank()` (with `chunks` chunks, attention
// through `cp` when given) split across `tp`, or the MLP split across `tp`. The run's (make_grid_model)
// and --verify's in-process TP ranks' (verify_grid.h).
std::shared_ptr<parallel::TensorParallelModule> make_split_model(const Options& o, const ChapterTask& task,
                                                                 comm::Communicator& pp, comm::Communicator& tp,
                                                                 int chunks, const parallel::ContextParallel* cp,
                                                                 Device device);
// A micro-batch's loss on a part of the model that holds all its layers (one pipeline stage): the
// GPT's through its stage (`batch`), the MLP's on its samples (`part`).
Tensor micro_batch_loss(parallel::TensorParallelModule& model, const ChapterTask& task,
                        const std::vector<std::int64_t>& part, const data::AdditionTask::Batch& batch);

// This rank's part of the model, made alike on every rank from the seed: its stage's layers (all of
// them when --pp is 1), each split across its TP group; with DP, wrapped in chapter 04/05's DDP on the
// DP group. --fault is installed here, on the run's own objects (common/faults/faults.h).
GridRun make_grid_model(const Options& o, const ChapterTask& task, parallel::Topology& topology, Device device);

// Replica `replica`'s share of a whole global batch (`batch`, the stream's next) of `replicas`, in `m`
// micro-batches.
std::vector<std::vector<std::int64_t>> micro_batches(const std::vector<std::int64_t>& batch, int replica, int replicas,
                                                     int m);
// Each micro-batch's weight in its replica's mean loss: the GPT's share of counted targets
// (parallel::micro_batch_weights), the MLP's 1/m (equal sizes).
std::vector<float> micro_batch_weights(const ChapterTask& task, const std::vector<std::vector<std::int64_t>>& parts,
                                       Device device);

// Forward and backward of one step over `parts`: through the pipeline's stages by `schedule` (the GPT
// with --pp 2 or more), or one micro-batch after the other on a model split by TP alone (accumulate).
// Each micro-batch's loss is weighted by its share of what counts (the GPT's counted targets, the MLP's
// samples); with DDP every backward but the last runs under no_sync, so the replicas average once.
// Both run the forward under `training`'s autocast (bf16, fp16; off in fp32) and backward from the loss
// times its loss scale (fp16).
parallel::PipelineStep run_stages(GridRun& run, const ChapterTask& task, parallel::Topology& topology,
                                  const std::vector<std::vector<std::int64_t>>& parts, const std::string& schedule,
                                  const optim::Recipe& training, Device device);
parallel::PipelineStep accumulate(GridRun& run, const ChapterTask& task,
                                  const std::vector<std::vector<std::int64_t>>& parts, const optim::Recipe& training,
                                  Device device);

// torch.nn.utils.clip_grad_norm_ over the whole model, which no rank holds (each rank counts what its model
// says counts once: TensorParallelModule::counts_once). Returns the norm.
Tensor clip_across_the_grid(const GridRun& run, parallel::Topology& topology, double max_norm);

// The run's figures: each step's time without --verify's work, the stage's busy time and peak
// activations; at the end gathered into the GridRun on every rank (bubble, peaks, last timelines, the
// slowest rank's mean step).
class StepFigures {
 public:
  explicit StepFigures(std::int64_t steps) : steps_(steps) {}
  void begin_step();
  // `checked_ms`: --verify's own work in the step (StepCheck::take_ms), left out of its time.
  void end_step(std::int64_t step, const parallel::PipelineStep& result, double checked_ms);
  void finish(GridRun& run, parallel::Topology& topology) const;

 private:
  std::int64_t steps_;
  std::chrono::steady_clock::time_point begin_;
  double busy_ms_ = 0, pipeline_ms_ = 0, whole_ms_ = 0;
  std::int64_t peak_ = 0;
  std::vector<parallel::TimedAction> last_;
};


}  // namespace course::chapter08
