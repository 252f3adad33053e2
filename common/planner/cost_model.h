// The planner's cost model: for a GPT, a global batch, a precision and a cluster, what one configuration
// of DP x TP x PP x CP, ZeRO stage, recomputation and micro-batch costs each GPU in memory (by category)
// and each iteration in time (compute, the communication of each group that nothing hides, the pipeline
// bubble), and the model FLOP utilisation that results. Every term is a formula of the papers the
// chapters implement (formulas.h) or a message of chapter 03's alpha-beta model; cost_model.cpp says which.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include "common/planner/cluster.h"
#include "common/planner/formulas.h"

namespace course::planner {

struct Workload {
  GptShape shape;
  double global_batch = 1;  // sequences per iteration
  DType precision = DType::bfloat16;  // mixed precision (float32 masters) or float32 throughout
};

struct ParallelConfig {
  int dp = 1, tp = 1, pp = 1, cp = 1;
  int zero_stage = 0;            // 0-3, over the data-parallel ranks (and the context-parallel ones)
  Recompute recompute = Recompute::none;
  bool sequence_parallel = false;  // with tp > 1
  int micro_batch = 1;           // sequences per micro-batch
  int virtual_stages = 1;        // model chunks per pipeline rank (interleaved 1F1B)
  int gpus() const { return dp * tp * pp * cp; }
};

// Bytes per GPU, on the stage that holds the most (the first: the token table and the most micro-batches
// in flight).
struct MemoryBreakdown {
  double parameters = 0, gradients = 0, optimizer = 0, activations = 0, buffers = 0;
  double total() const { return parameters + gradients + optimizer + activations + buffers; }
};

// Seconds per iteration on the slowest stage.
struct TimeBreakdown {
  double compute = 0;   // GEMMs and element-wise work of every micro-batch, recomputation included
  double tp = 0, cp = 0, pp = 0, dp = 0;  // communication nothing overlaps, per group
  double bubble = 0;    // the pipeline's fill and drain
  double optimizer = 0;
  double total() const { return compute + tp + cp + pp + dp + bubble + optimizer; }
};

struct Prediction {
  ParallelConfig config;
  MemoryBreakdown memory;
  TimeBreakdown time;
  int micro_batches = 0;        // per replica per iteration
  double tokens_per_second = 0;
  double tflops_per_gpu = 0;    // as Megatron-LM counts: its FLOPs formula, recomputation included
  double mfu = 0;               // model FLOP utilisation (PaLM): the FLOPs without recomputation / peak
  std::string rejected;         // why the configuration cannot run ("kind: details"); empty when it can
};

// What a GPU may hold: the device's memory less what the CUDA context, NCCL's buffers and the caching
// allocator's fragmentation take (PyTorch runs commonly report 5-10% of the memory unusable for tensors).
constexpr double kUsableMemoryFraction = 0.9;

// The configuration's cost. A configuration that cannot run comes back with `rejected` saying why as
// "kind: details" (the kinds: TP across nodes, out of memory, too few micro-batches for the bubble, a degree
// that does not divide the model, ...); out of memory, with its figures.
Prediction predict(const Workload& w, const Cluster& c, const ParallelConfig& config);

// Chapter 04's MLP: `features` in, `layers` hidden layers of `hidden` with ReLU, one output, a squared loss.
struct MlpShape {
  std::int64_t features = 16, hidden = 256;
  int layers = 2;
};

// How a step's gradients travel (chapter 05's four modes, common/parallel/reducer.h): in buckets of at most
// `cap_bytes` (the first `first_cap_bytes`), filled in backward's order as parallel::assign_buckets_by_size
// fills them (a cap of 0: one tensor a bucket, chapter 04's way), all-reduced one after another on the
// link, either after backward or each as soon as its last gradient is in (`overlap`).
struct Bucketing {
  double first_cap_bytes = 0, cap_bytes = 0;
  bool overlap = false;
  bool average_loss = true;  // chapter 04 also all-reduces the loss for its log; 05 does not
  // --sim-network's link: each all-reduce takes at least its time (the real one runs underneath).
  std::optional<Link> simulated = std::nullopt;
};

struct MlpStep {
  TimeBreakdown time;        // dp: the communication nothing overlapped (exposed)
  int buckets = 0;           // all-reduces a step, the loss's not counted
  double communication = 0;  // every bucket's all-reduce, hidden or not
};

// One step of data parallelism on chapter 04's MLP on `ranks` ranks of the cluster's device, in float32:
// each rank computes its share of the global batch (the largest, ceil(batch / ranks), sets the step); the
// gradients travel as `how` says (by default 04's: every tensor in turn after backward, then the loss);
// then SGD's update. An all-reduce here costs the link's ring and, on the CPU, the sum and the average's
// passes over memory. With overlap, each layer's gradients are in when its backward ends (backward runs the
// layers last to first); the link takes one bucket at a time, so bucket i ends at
// max(ready_i, end_{i-1}) + its all-reduce, and what ends after backward is exposed.
MlpStep predict_mlp_step(const MlpShape& shape, double global_batch, int ranks, const Cluster& c,
                         const Bucketing& how = {});

// One step of chapter 07's ZeRO at `stage` on chapter 04's MLP (float32 AdamW, its update clipped) on
// `ranks` ranks: the share's compute; the stage's collectives (0: the gradients all-reduced; 1: reduce-
// scattered, and the parameters all-gathered after the update; 2: reduce-scattered a unit, a layer, at a
// time, the same all-gather; 3: each unit's parameters all-gathered for forward and again for backward, its
// gradients reduce-scattered), none of them hidden: a rank of this machine does a collective's work on the
// core that computes (chapter 05 measured overlap hiding none of it on the real transport); the loss's
// all-reduce and, sharded, the gradient norm's; AdamW and its norm on the rank's part. Priced as compute,
// dp (the collectives) and optimizer.
TimeBreakdown predict_zero_mlp_step(const MlpShape& shape, double global_batch, int ranks, const Cluster& c, int stage);

// "TP(8)-PP(8)-DP(16) mb 1 v 2 ZeRO-1 full SP": one line for a table.
std::string describe(const ParallelConfig& config);

}  // namespace course::planner
