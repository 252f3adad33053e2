// Tensor parallelism within a layer (Megatron-LM: Shoeybi et al., "Megatron-LM: Training Multi-Billion
// Parameter Language Models Using Model Parallelism", 2019, section 3). A linear layer y = x W^T is
// split across the ranks of a tensor-parallel group in one of two ways:
//   column-parallel: W's rows (the output features) are split; each rank computes its slice of y from
//                    the whole x. Nothing to sum forward; backward, each rank holds only its part of
//                    dL/dx, so the parts are summed (all-reduce).
//   row-parallel:    W's columns (the input features) are split; each rank takes its slice of x and
//                    computes a partial y; the partials are summed: y = sum_i x_i W_i^T (all-reduce).
// An MLP block is column- then row-parallel, so the slice of the hidden layer never leaves its rank:
// one all-reduce forward (g, after the row layer) and one backward (f, before the column layer).
//   f: identity forward, all-reduce backward         (copy_to_tensor_parallel)
//   g: all-reduce forward, identity backward         (reduce_from_tensor_parallel)
//
// Sequence parallelism (Korthikanti et al., "Reducing Activation Recomputation in Large Transformer
// Models", 2022, section 4.2.2): outside f and g, between the row layer of one block and the column
// layer of the next, every rank holds the same whole activations and repeats the same layer norms,
// residual adds and dropouts on them. Split those along the sequence instead, each rank its shard
// [B, T / size, C], and the two operators change:
//   g -> reduce-scatter forward (each rank keeps the sum of its shard), all-gather backward
//   f -> all-gather forward (the column layer needs the whole sequence), reduce-scatter backward
// A ring all-reduce is a reduce-scatter then an all-gather, so the bytes on the wire are the same; the
// activations outside the tensor-parallel region, and their work, are 1 / size.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "common/comm/communicator.h"
#include "common/nn/layers.h"
#include "common/nn/module.h"

namespace course::parallel {

Tensor copy_to_tensor_parallel(const Tensor& x, comm::Communicator& tp);       // f
Tensor reduce_from_tensor_parallel(const Tensor& x, comm::Communicator& tp);   // g

// Sequence parallelism's f and g. Dimension 1 of x is the sequence ([B, T, ...]), cut in `size`
// contiguous shards in rank order.
Tensor gather_sequence(const Tensor& x, comm::Communicator& tp);          // [B, T/size, ...] -> [B, T, ...]
Tensor reduce_scatter_sequence(const Tensor& x, comm::Communicator& tp);  // [B, T, ...] partial -> [B, T/size, ...] summed

// Adds the gradients of these parameters over the group, in one all-reduce of them all: under
// sequence parallelism a parameter whole on every rank (a layer norm's, a row layer's bias) saw only
// its rank's shard of the sequence, so each rank holds a partial sum of its gradient (Megatron-LM
// all-reduces its sequence-parallel gradients the same way, after backward).
void all_reduce_gradients(const std::vector<Tensor>& parameters, comm::Communicator& tp);

// A model split across a tensor-parallel group that can say how: its parameters keep the whole
// model's names, and for each it knows whether the group splits it and which part of the whole
// model's tensor of that name (a parameter or a gradient) this rank holds. Verification, clipping and
// checkpoints need nothing else to relate a rank's parameters to the whole model's.
class TensorParallelModule : public nn::Module {
 public:
  virtual bool is_split(const std::string& name) const = 0;
  // Whether this rank's tensor `name` counts once in a sum over the whole model (a clip's norm, the one
  // copy of each element a check gathers): a part the TP group splits counts on every rank, a tensor every
  // TP rank holds whole on TP rank 0 alone, and a copy another stage also holds (the tied table's, on the
  // last stage) nowhere but the first.
  virtual bool counts_once(const std::string& name) const = 0;
  // This rank's part of `whole` (the whole model's tensor named `name`); `whole` itself if not split.
  virtual Tensor part_of(const std::string& name, const Tensor& whole) const = 0;
  // After backward, what a model split this way must still add up (finish_gradients): with sequence
  // parallelism, the partial gradients of the parameters whole on every TP rank; with the tied table on
  // two pipeline stages, each stage's half of its gradient. Nothing, for a model without either.
  virtual void sync_sequence_parallel_gradients() {}
  virtual void sync_tied_gradients() {}
};

// After backward, Megatron-LM's finalize_model_grads, in its order: (1) the data-parallel average,
// which DistributedDataParallel has already done on the DP group during the last backward (its buckets
// are complete when backward returns); (2) with sequence parallelism, the partial gradients of the
// parameters whole on every TP rank summed over the TP group; (3) the tied table's two halves, on the
// first and the last pipeline stage, added together. Then every part's gradient is the whole model's.
void finish_gradients(TensorParallelModule& model);

// The part [rank x n / size, (rank + 1) x n / size) of dimension `dim` of `full` (a copy, on full's
// device). Throws UsageError when the dimension does not divide by the group's size.
Tensor shard_of(const Tensor& full, int dim, comm::Communicator& tp, const char* what);

// Both layers are made from an ordinary nn::Linear that every rank built with the same seed, and take
// their rank's part of it, so that the sharded model starts exactly where the unsharded one does.
// With `sequence_parallel`, the column layer takes a sequence shard [B, T / size, in] and gathers the
// sequence (f's replacement); the row layer returns a shard [B, T / size, out], its partial products
// reduce-scattered (g's replacement) and the bias added to the shard.
class ColumnParallelLinear : public nn::Module {
 public:
  ColumnParallelLinear(const nn::Linear& full, comm::Communicator& tp, bool sequence_parallel = false);
  // From this rank's part, already cut (c_attn's rows are cut head by head: shard_of_qkv).
  ColumnParallelLinear(const Tensor& weight_part, const Tensor& bias_part, comm::Communicator& tp,
                       bool sequence_parallel = false);
  // x whole, [..., in]; returns this rank's slice of the output, [..., out / size].
  Tensor forward(const Tensor& x) override;
  Tensor weight, bias;  // [out / size, in], [out / size]

 private:
  comm::Communicator& tp_;
  bool sequence_parallel_;
};

class RowParallelLinear : public nn::Module {
 public:
  RowParallelLinear(const nn::Linear& full, comm::Communicator& tp, bool sequence_parallel = false);
  // x is this rank's slice, [..., in / size] (a column-parallel layer's output); returns the whole
  // output, [..., out], the same on every rank: the partial products summed, then the bias added once.
  Tensor forward(const Tensor& x) override;
  Tensor weight, bias;  // [out, in / size], [out] (whole: every rank adds the same bias)

 private:
  comm::Communicator& tp_;
  bool sequence_parallel_;
};

// The vocabulary split across the group (Megatron-LM's VocabParallelEmbedding): rank r holds rows
// [r V / size, (r + 1) V / size) of the token table. Each rank looks up the ids it holds (zeros for the
// others) and g sums the parts, so every rank gets the whole embedding; backward, each rank's rows get
// the gradient of its own ids. With the head tied to the table, the logits come out split by vocabulary
// too ([N, V / size] per rank), which parallel_cross_entropy takes as they are. With
// `sequence_parallel`, the parts are reduce-scattered instead (ids [B, T] -> this rank's shard
// [B, T / size, C]) and the head gathers the sequence before its product.
class VocabParallelEmbedding : public nn::Module {
 public:
  // This rank's rows of `full_table` [V, C], which every rank made with the same seed.
  VocabParallelEmbedding(const Tensor& full_table, comm::Communicator& tp, bool sequence_parallel = false);
  Tensor forward(const Tensor& ids) override;  // ids of any shape -> ids.shape + [C], the same on every rank
  // The tied head: x [B, T, C] (the same on every rank; with sequence parallelism this rank's shard,
  // [B, T / size, C]) times this rank's rows: [B * T, V / size].
  Tensor logits(const Tensor& x);
  std::int64_t first_row() const { return first_; }
  Tensor weight;  // [V / size, C]

 private:
  comm::Communicator& tp_;
  bool sequence_parallel_;
  std::int64_t first_ = 0;
};

// F.cross_entropy (mean over the rows not ignored) of logits split by vocabulary: each rank holds
// columns [first_column, first_column + V / size) of [N, V]. The whole logits never meet: the ranks
// all-reduce three numbers per row (the row's maximum, its sum of exponentials, and the target's
// logit, which one rank holds), 3N floats whatever the vocabulary. The gradient of each rank's columns
// is softmax minus one-hot there. Targets are indices as floats; ignore_index rows count for nothing.
Tensor parallel_cross_entropy(const Tensor& local_logits, const Tensor& targets, std::int64_t first_column,
                              comm::Communicator& tp, int ignore_index = -100);

}  // namespace course::parallel
