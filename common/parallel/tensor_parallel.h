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
#pragma once
#include <cstdint>

#include "common/comm/communicator.h"
#include "common/nn/layers.h"
#include "common/nn/module.h"

namespace course::parallel {

Tensor copy_to_tensor_parallel(const Tensor& x, comm::Communicator& tp);       // f
Tensor reduce_from_tensor_parallel(const Tensor& x, comm::Communicator& tp);   // g

// The part [rank x n / size, (rank + 1) x n / size) of dimension `dim` of `full` (a copy, on full's
// device). Throws UsageError when the dimension does not divide by the group's size.
Tensor shard_of(const Tensor& full, int dim, comm::Communicator& tp, const char* what);

// Both layers are made from an ordinary nn::Linear that every rank built with the same seed, and take
// their rank's part of it, so that the sharded model starts exactly where the unsharded one does.
class ColumnParallelLinear : public nn::Module {
 public:
  ColumnParallelLinear(const nn::Linear& full, comm::Communicator& tp);
  // From this rank's part, already cut (c_attn's rows are cut head by head: shard_of_qkv).
  ColumnParallelLinear(const Tensor& weight_part, const Tensor& bias_part, comm::Communicator& tp);
  // x whole, [..., in]; returns this rank's slice of the output, [..., out / size].
  Tensor forward(const Tensor& x) override;
  Tensor weight, bias;  // [out / size, in], [out / size]

 private:
  comm::Communicator& tp_;
};

class RowParallelLinear : public nn::Module {
 public:
  RowParallelLinear(const nn::Linear& full, comm::Communicator& tp);
  // x is this rank's slice, [..., in / size] (a column-parallel layer's output); returns the whole
  // output, [..., out], the same on every rank: the partial products summed, then the bias added once.
  Tensor forward(const Tensor& x) override;
  Tensor weight, bias;  // [out, in / size], [out] (whole: every rank adds the same bias)

 private:
  comm::Communicator& tp_;
};

// The vocabulary split across the group (Megatron-LM's VocabParallelEmbedding): rank r holds rows
// [r V / size, (r + 1) V / size) of the token table. Each rank looks up the ids it holds (zeros for the
// others) and g sums the parts, so every rank gets the whole embedding; backward, each rank's rows get
// the gradient of its own ids. With the head tied to the table, the logits come out split by vocabulary
// too ([N, V / size] per rank), which parallel_cross_entropy takes as they are.
class VocabParallelEmbedding : public nn::Module {
 public:
  // This rank's rows of `full_table` [V, C], which every rank made with the same seed.
  VocabParallelEmbedding(const Tensor& full_table, comm::Communicator& tp);
  Tensor forward(const Tensor& ids) override;  // ids of any shape -> ids.shape + [C], the same on every rank
  // The tied head: x [..., C] (the same on every rank) times this rank's rows, [..., V / size].
  Tensor logits(const Tensor& x);
  std::int64_t first_row() const { return first_; }
  Tensor weight;  // [V / size, C]

 private:
  comm::Communicator& tp_;
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
