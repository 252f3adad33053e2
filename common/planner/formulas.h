// The planner's formulas, each from its paper: what a GPT of a given shape costs in parameters, in FLOPs
// per iteration, in activation memory per layer and in model states per GPU, and how long training it
// takes. The chapters measure these quantities and print them beside the same formulas (07's model
// states, 08's activations); a planner for many GPUs adds them up for a configuration no one has run.
#pragma once
#include <cstdint>

#include "common/core/dtype.h"
#include "common/nn/gpt.h"
#include "common/parallel/zero.h"

namespace course::planner {

// l layers of hidden size h with a attention heads, sequences of s tokens, a vocabulary of V.
struct GptShape {
  std::int64_t layers = 0, hidden = 0, heads = 0, sequence = 0, vocabulary = 0;
};

// Narayanan et al., "Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM",
// SC 2021, section 5.1: P = 12 l h^2 (1 + 13 / 12h + (V + s) / 12lh) (the blocks' weights and biases,
// the layer norms, the token and position tables).
double parameters(const GptShape& g);

// The FLOPs of one iteration on a batch of B sequences (the same paper, section 5.1): a layer's forward
// is 24 B s h^2 + 4 B s^2 h (the four projections' GEMMs, the scores and their weighted sum), the logit
// layer's 2 B s h V; backward twice the forward; full recomputation one more forward of the layers:
//   with recomputation   96 B s l h^2 (1 + s / 6h + V / 16lh)
//   without              72 B s l h^2 (1 + s / 6h + V / 12lh)
double flops_per_iteration(const GptShape& g, double batch, bool recomputation);

// The paper's end-to-end estimate (its equation 4): training on T tokens takes 8 T P / (n X) seconds on n
// GPUs of X FLOP/s each with recomputation (6 T P / (n X) without), the 96 B s l h^2 above being 8 B s P
// when h dominates s and V / l.
double training_seconds(double tokens, double parameters, int gpus, double flops_per_gpu, bool recomputation);

// Activation memory of one transformer layer in bytes, activations in 16 bits (Korthikanti et al.,
// "Reducing Activation Recomputation in Large Transformer Models", 2022, table 2), for a micro-batch of
// b sequences on t tensor-parallel ranks:
//   no recomputation                 s b h (10 + 24 / t + 5 a s / h t)
//   with sequence parallelism        s b h / t (34 + 5 a s / h)
//   selective recomputation          s b h (10 + 24 / t), with sequence parallelism 34 s b h / t
//   full recomputation               2 s b h (the layer's input), with sequence parallelism 2 s b h / t
// The recomputation forms are the chapters' own (nn::Recompute, --recompute).
using Recompute = nn::Recompute;
double activation_bytes_per_layer(const GptShape& g, double micro_batch, int tp, bool sequence_parallel, Recompute r);

// The model states one GPU holds (Rajbhandari et al., "ZeRO", SC 2020, section 5 and figure 1): b bytes
// a parameter and a gradient (4 in float32, 2 in 16 bits) and K bytes of optimizer state (Adam's two
// moments, 8; in mixed precision with the float32 masters, 12), each sharded over the N data-parallel
// ranks from its stage on (stage 1 the optimizer state, 2 the gradients too, 3 the parameters too).
// With ZeRO-Offload (Ren et al. 2021) the float32 masters and the moments (12 bytes a parameter of this
// rank's part), the gradients' part at stages 2-3 and, offloading the parameters too, their part live in
// host memory instead.
struct ModelStates {
  double params = 0, grads = 0, optimizer = 0;  // on the GPU; optimizer: Adam's moments (and the masters)
  double host = 0;                              // offloaded
  double total() const { return params + grads + optimizer; }  // on the GPU
};
ModelStates zero_model_states(int stage, double psi, int n, DType precision,
                              parallel::ZeroOptions::Offload offload = parallel::ZeroOptions::Offload::none);

}  // namespace course::planner
