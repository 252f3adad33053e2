// Published training runs the planner's predictions are checked against: Narayanan et al., "Efficient
// Large-Scale Language Model Training on GPU Clusters Using Megatron-LM" (SC 2021), table 1: GPT models
// of 1.7B to 1T parameters (vocabulary 51,200, sequences of 2048) on 32 to 3,072 A100s (312 TFLOP/s
// dense 16-bit peak), tensor parallelism within a node, pipeline parallelism across, data parallelism
// over the rest; its table 2, GPT-3 175B itself; and its figure 13, the sweep behind its rule of keeping
// tensor parallelism within a node.
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
  double percent_of_peak;    // of 312 TFLOP/s (0 where the paper does not print it)
  double aggregate_pflops;   // over all the GPUs (0 where the paper does not print it)
};
constexpr double kA100PeakFlops = 312e12;

const std::vector<PublishedRun>& megatron_2021_table1();

// Table 2, PTD-P's rows of GPT-3 175B (96 layers of 12,288, 96 heads): a model-parallel size of 96, TP 8
// x PP 12, at the global batch of 1536, on 384 and 1,536 GPUs (DP 4 and 16). Its throughput falls as DP
// grows at a fixed batch: fewer micro-batches a replica, a larger share of bubble.
const std::vector<PublishedRun>& megatron_2021_table2_gpt3();

// Figure 13: a 162.2B GPT (32 layers of 20,480, 128 heads) on 64 A100s, every PP x TP of 64 (TP 2 to
// 32), at global batches of 32 and 128, DP 1. The paper's finding (its takeaway 1): TP 8 x PP 8, tensor
// parallelism as wide as a node and no wider, is the fastest at both batches.
struct PublishedSweep {
  double billions;
  GptShape shape;
  int gpus;
  std::vector<int> tp;       // each with PP = gpus / TP
  std::vector<int> batches;
  int fastest_tp, fastest_pp;
};
const PublishedSweep& megatron_2021_figure13();

}  // namespace course::planner
