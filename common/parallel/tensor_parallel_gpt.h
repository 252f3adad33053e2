// The GPT's blocks (nn::Block) split across a tensor-parallel group, as Megatron-LM splits a
// transformer (Shoeybi et al. 2019, figure 3):
//   attention: the heads are split; c_attn is column-parallel by head (each rank computes the queries,
//              keys and values of its heads), c_proj row-parallel: one all-reduce forward (g), one
//              backward (f), as in the MLP.
//   MLP:       c_fc column-parallel, c_proj row-parallel.
//   the token table vocabulary-parallel, the head tied to it, the loss the parallel cross-entropy.
// Layer norms, the position table and the row-parallel biases are whole on every rank: their inputs
// and their gradients are the same on every rank (without sequence parallelism). Built from a whole
// nn::GPT that every rank made with the same seed, so the sharded model starts exactly where the
// unsharded one does. Dropout must be off. The whole model split this way is a PipelineStageGPT of a
// one-stage pipeline (pipeline.h), which holds the embeddings, the head and the loss.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/nn/gpt.h"
#include "common/parallel/tensor_parallel.h"

namespace course::parallel {

// c_attn's rows are the queries, keys and values of every head, one after the other ([3C, C]); this
// rank's part is its heads' rows of each of the three ([3C / size, C]). Works on c_attn's bias too.
Tensor shard_of_qkv(const Tensor& full, comm::Communicator& tp);

// One pre-norm block of nn::GPT with its attention's heads and its MLP's hidden units split across
// the group: one all-reduce forward after attention and one after the MLP (g), and one each backward (f).
// With `sequence_parallel` it takes and returns this rank's shard of the sequence, [B, T / size, C]:
// the layer norms and the residual adds run on the shard, each all-reduce becomes a reduce-scatter
// forward and an all-gather backward, and each f an all-gather forward and a reduce-scatter backward.
class TensorParallelBlock : public nn::Module {
 public:
  TensorParallelBlock(const nn::Block& full, const nn::GPTConfig& config, comm::Communicator& tp,
                      bool sequence_parallel = false);
  // config.recompute as nn::Block does it: selective recomputes attention's probabilities in backward;
  // full runs the whole block again in backward, its collectives too (every TP rank recomputes the same
  // block at the same point of backward, so they stay matched).
  Tensor forward(const Tensor& x) override;
  // Attention's core on this rank's heads (nn::AttentionCore; context parallelism sets its own).
  void set_attention_core(nn::AttentionCore core) { core_ = std::move(core); }

 private:
  Tensor layers(const Tensor& x);
  Tensor attention(const Tensor& x);
  Tensor mlp(const Tensor& x);
  std::shared_ptr<nn::LayerNorm> ln_1_, ln_2_;
  std::shared_ptr<ColumnParallelLinear> c_attn_, c_fc_;
  std::shared_ptr<RowParallelLinear> attn_proj_, mlp_proj_;
  std::int64_t local_heads_;
  nn::Recompute recompute_;
  nn::AttentionCore core_;
};

// A copy of a layer norm, parameters of its own.
std::shared_ptr<nn::LayerNorm> copy_of(const nn::LayerNorm& full);

// Throws UsageError unless the heads and the vocabulary divide among the group and dropout is off.
void check_tensor_parallel(const nn::GPTConfig& config, int ranks);

// How tensor parallelism cuts the GPT's parameter of this GPT-2 name ("transformer.h.0.mlp.c_fc.weight",
// with or without "transformer."): the token table and the column layers (c_fc, c_attn by head) by
// rows, the row layers' weights (both c_proj) by columns; the rest (layer norms, the position table,
// the row layers' biases) is whole on every rank. The one rule that the model, its verification and
// its clipping share.
enum class GptCut { whole, rows, qkv_rows, columns };
GptCut gpt_cut(const std::string& name);
// This rank's part of the whole GPT's tensor named `name` (a parameter or a gradient).
Tensor gpt_part(const std::string& name, const Tensor& whole, comm::Communicator& tp);

}  // namespace course::parallel
