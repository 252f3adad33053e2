// Published training runs the planner's predictions are checked against: Narayanan et al., "Efficient
// Large-Scale Language Model Training on GPU Clusters Using Megatron-LM" (SC 2021), table 1: GPT models
// of 1.7B to 1T parameters (vocabulary 51,200, sequences of 2048) on 32 to 3,072 A100s (312 TFLOP/s
// dense 16-bit peak), tensor parallelism within a node, pipeline parallelism across, data parallelism
// over the rest.
#pragma once
#include <vector>

#include "common/planner/formulas.h"

namespace course::planner {

struct PublishedRun {
  double billions;           // the parameters, as the paper rounds them
  GptShape shape;            // layers, hidden, heads, sequence, vocabulary
  int tp, pp, gpus;          // data parallelism: gpus / (tp pp)
  int batch;                 // sequences per iteration
  double tflops_per_gpu;     // achieved, end to end (model FLOPs with recomputation: 96 B s l h^2 (...))
  double percent_of_peak;    // of 312 TFLOP/s
  double aggregate_pflops;   // over all the GPUs
};
constexpr double kA100PeakFlops = 312e12;

const std::vector<PublishedRun>& megatron_2021_table1();

}  // namespace course::planner
