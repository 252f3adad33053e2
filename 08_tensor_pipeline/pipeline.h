// Lesson 2, pipeline parallelism: the layers cut into --pp stages, the batch into m micro-batches that
// pass along them by a schedule (GPipe, Huang et al., 2019; 1F1B and interleaved 1F1B, Narayanan et al.,
// 2021; zero bubble, Qi et al., 2024). A schedule is data (common/parallel/pipeline_schedule.h): each
// stage's list of forward, backward and weight passes; run_pipeline (common/parallel/pipeline.h) plays
// it, sending activations forward and their gradients back. Each stage idles for the bubble,
// (p - 1)/(m + p - 1) with one chunk a stage.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "08_tensor_pipeline/grid.h"
#include "08_tensor_pipeline/task.h"
#include "common/optim/recipe.h"
#include "common/parallel/pipeline.h"
#include "common/parallel/topology.h"

namespace course::chapter08 {

// Forward and backward of one step over `parts`, through the pipeline's stages by `schedule` (the GPT
// with --pp 2 or more). Each micro-batch's loss is weighted by its share of the counted targets; with DDP
// each chunk's last backward synchronises its replicas. The forwards under `training`'s autocast,
// backward from each loss times its loss scale (fp16).
parallel::PipelineStep run_stages(GridRun& run, const ChapterTask& task, parallel::Topology& topology,
                                  const std::vector<std::vector<std::int64_t>>& parts, const std::string& schedule,
                                  const optim::Recipe& training, Device device);

}  // namespace course::chapter08
