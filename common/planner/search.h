// The planner's search: every configuration of a model on a cluster, those that fit ranked by predicted
// throughput, the others grouped by why they cannot run. The "deciding on a parallelism strategy" slide
// of a distributed-training course (the model fits one GPU or not, its largest layer fits or not, one
// node or many), computed instead of recited.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "common/planner/cost_model.h"
#include "common/planner/published.h"

namespace course::planner {

// What the search tries besides every DP x TP x PP x CP that multiplies to the cluster's GPUs.
struct SearchSpace {
  std::vector<int> micro_batches{1, 2, 4, 8};
  // Model chunks per pipeline rank (interleaved 1F1B). Empty: every v that divides a stage's layers, down
  // to one layer a chunk, as Megatron-LM allows; a list: only those.
  std::vector<int> virtual_stages;
  std::vector<int> zero_stages{0, 1, 2, 3};
  std::vector<Recompute> recomputations{Recompute::none, Recompute::selective, Recompute::full};
  bool sequence_parallel = true;  // try each TP > 1 with and without it
  bool context_parallel = true;   // try CP 2, 4, 8 besides 1
};

// What Megatron-LM 2021 had: TP, PP with interleaving, DP, full recomputation; no ZeRO, sequence
// parallelism or context parallelism (each came later).
SearchSpace megatron_2021_space();

struct SearchResult {
  std::vector<Prediction> fitting;  // fastest first
  // Why the others cannot run: the reason's kind (the text before its ':', e.g. "out of memory") ->
  // how many, and one of them in full.
  struct Rejections {
    long count = 0;
    Prediction example;
  };
  std::map<std::string, Rejections> rejected;
  long tried = 0;
};

SearchResult search(const Workload& w, const Cluster& c, const SearchSpace& space = {});

// One grid as the planner predicts it: a model at a global batch on `gpus` GPUs of DGX A100 nodes as TP x
// PP x DP (the rest), in 16 bits with full recomputation, at the micro-batch and interleaving of `space`
// that run fastest (the paper tuned both and does not print them). Where none can run, the prediction
// says why (the first reason met).
Prediction predict_fastest(const GptShape& shape, double batch, int tp, int pp, int gpus,
                           const SearchSpace& space = megatron_2021_space());

// A published run as the planner predicts it (predict_fastest of its model, batch and grid).
Prediction predict_published(const PublishedRun& run, const SearchSpace& space = megatron_2021_space());

}  // namespace course::planner
