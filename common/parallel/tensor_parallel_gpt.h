// The GPT (nn::GPT) with every layer split across a tensor-parallel group, as Megatron-LM splits a
// transformer (Shoeybi et al. 2019, figure 3):
//   attention: the heads are split; c_attn is column-parallel by head (each rank computes the queries,
//              keys and values of its heads), c_proj row-parallel: one all-reduce forward (g), one
//              backward (f), as in the MLP.
//   MLP:       c_fc column-parallel, c_proj row-parallel.
//   the token table vocabulary-parallel, the head tied to it, the loss the parallel cross-entropy.
// Layer norms, the position table and the row-parallel biases are whole on every rank: their inputs
// and their gradients are the same on every rank. Built from a whole nn::GPT that every rank made with
// the same seed, so the sharded model starts exactly where the unsharded one does. Dropout must be off.
#pragma once
#include <memory>
#include <vector>

#include "common/nn/gpt.h"
#include "common/parallel/tensor_parallel.h"

namespace course::parallel {

// c_attn's rows are the queries, keys and values of every head, one after the other ([3C, C]); this
// rank's part is its heads' rows of each of the three ([3C / size, C]). Works on c_attn's bias too.
Tensor shard_of_qkv(const Tensor& full, comm::Communicator& tp);

// One pre-norm block of nn::GPT with its attention's heads and its MLP's hidden units split across
// the group: one all-reduce forward after attention and one after the MLP (g), and one each backward (f).
class TensorParallelBlock : public nn::Module {
 public:
  TensorParallelBlock(const nn::Block& full, const nn::GPTConfig& config, comm::Communicator& tp);
  Tensor forward(const Tensor& x) override;

 private:
  Tensor attention(const Tensor& x);
  Tensor mlp(const Tensor& x);
  std::shared_ptr<nn::LayerNorm> ln_1_, ln_2_;
  std::shared_ptr<ColumnParallelLinear> c_attn_, c_fc_;
  std::shared_ptr<RowParallelLinear> attn_proj_, mlp_proj_;
  std::int64_t local_heads_;
};

// A copy of a layer norm, parameters of its own.
std::shared_ptr<nn::LayerNorm> copy_of(const nn::LayerNorm& full);

// Throws UsageError unless the heads and the vocabulary divide among the group and dropout is off.
void check_tensor_parallel(const nn::GPTConfig& config, int ranks);

class TensorParallelGPT : public nn::Module {
 public:
  // Throws UsageError when the heads, the vocabulary or 4 x n_embd do not divide by the group's size,
  // or when dropout is on.
  TensorParallelGPT(const nn::GPT& full, comm::Communicator& tp);
  // ids [B, T] -> this rank's slice of the logits, [B * T, vocab / size].
  Tensor forward(const Tensor& ids) override;
  // The mean cross-entropy of the whole vocabulary, the same on every rank.
  Tensor loss(const Tensor& ids, const Tensor& targets, int ignore_index = -100);
  const nn::GPTConfig& config() const { return config_; }

 private:
  nn::GPTConfig config_;
  comm::Communicator& tp_;
  std::shared_ptr<VocabParallelEmbedding> wte_;
  Tensor wpe_;
  std::vector<std::shared_ptr<TensorParallelBlock>> blocks_;
  std::shared_ptr<nn::LayerNorm> ln_f_;
};

}  // namespace course::parallel
