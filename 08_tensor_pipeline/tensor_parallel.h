// Lesson 1, tensor and sequence parallelism: every layer split across the ranks of a TP group
// (Shoeybi et al., Megatron-LM, 2019). A column-parallel linear splits its outputs, a row-parallel one its
// inputs, so y = sum_i x_i W_i takes one all-reduce; paired (attention's heads, the MLP's hidden units,
// the vocabulary), a block needs one all-reduce forward and one backward (common/parallel/
// tensor_parallel.h, tensor_parallel_gpt.h). Sequence parallelism (Korthikanti et al., 2022) turns each
// all-reduce into a reduce-scatter and an all-gather, and the layer norms between them hold 1/tp of the
// sequence. A model TP alone splits trains one micro-batch after the other (accumulate); the norm to
// clip by is the whole model's, which no rank holds (clip_across_the_grid).
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "08_tensor_pipeline/grid.h"
#include "08_tensor_pipeline/options.h"
#include "08_tensor_pipeline/task.h"
#include "common/optim/recipe.h"
#include "common/parallel/context_parallel.h"
#include "common/parallel/pipeline.h"
#include "common/parallel/tensor_parallel.h"
#include "common/parallel/topology.h"

namespace course::chapter08 {

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
// Forward and backward of one step over `parts` on a model split by TP alone: one micro-batch after the
// other, each loss weighted by its share of what counts; with DDP every backward but the last runs
// under no_sync, so the replicas average once. The forward under `training`'s autocast (bf16, fp16; off
// in fp32), backward from the loss times its loss scale (fp16).
parallel::PipelineStep accumulate(GridRun& run, const ChapterTask& task,
                                  const std::vector<std::vector<std::int64_t>>& parts, const optim::Recipe& training,
                                  Device device);
// torch.nn.utils.clip_grad_norm_ over the whole model, which no rank holds (each rank counts what its model
// says counts once: TensorParallelModule::counts_once). Returns the norm.
Tensor clip_across_the_grid(const GridRun& run, parallel::Topology& topology, double max_norm);

}  // namespace course::chapter08
