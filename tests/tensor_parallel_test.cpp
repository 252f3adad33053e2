// Tensor parallelism against the unsharded layers, under mpirun with 1, 2 and 4 ranks (the whole world
// is the tensor-parallel group): an MLP block made column- then row-parallel gives the unsharded
// block's output on every rank, and every gradient (the input's, and each rank's slice of each weight
// and bias) is the matching slice of the unsharded gradient; forward and backward each cost one
// all-reduce, of the output and of the input. The vocabulary-parallel embedding with its tied head and
// the parallel cross-entropy give the unsharded loss and each rank's slice of the gradient, moving 3
// floats per row. The GPT split by heads, with and without sequence parallelism, and the MLP split in
// pairs give the whole model's loss and every gradient's part.
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "common/nn/gpt.h"
#include "common/nn/layers.h"
#include "common/ops/ops.h"
#include "common/parallel/tensor_parallel.h"
#include "common/parallel/pipeline.h"
#include "common/parallel/tensor_parallel_gpt.h"
#include "common/parallel/tensor_parallel_mlp.h"
#include "common/verify/whole_model.h"
#include "common/autograd/autograd.h"
#include "common/verify/local_group.h"
#include "common/ops/autocast.h"
#include "common/verify/model_parallel_reference.h"
#include "common/verify/compare.h"
#include "common/verify/contribution_magnitudes.h"
#include "support/mpi_main.h"

namespace course::testing {
namespace {

// The row-parallel layer sums its 16 products in `size` partial sums before adding them, where the
// unsharded GEMM sums them in one pass: the same terms (below 4 in magnitude) in another order, a few
// float32 roundings of the sum apart. Any wrong slice or missing reduction is off by whole terms.
constexpr double kReorderTolerance = 1e-5;

// Rows [first, first + count) of a row-major [rows, cols] matrix, or its columns.
std::vector<float> rows_of(const Tensor& t, std::int64_t first, std::int64_t count) {
  const auto v = t.to_host();
  const std::int64_t cols = t.numel() / t.dim(0);
  return {v.begin() + first * cols, v.begin() + (first + count) * cols};
}
std::vector<float> columns_of(const Tensor& t, std::int64_t first, std::int64_t count) {
  const auto v = t.to_host();
  const std::int64_t cols = t.dim(1);
  std::vector<float> out;
  for (std::int64_t r = 0; r < t.dim(0); ++r)
    out.insert(out.end(), v.begin() + r * cols + first, v.begin() + r * cols + first + count);
  return out;
}

TEST(TensorParallel, ColumnThenRowIsTheUnshardedMlpBlock) {
  comm::Communicator& tp = world();
  const int n = tp.size(), r = tp.rank();
  constexpr std::int64_t kBatch = 5, kIn = 8, kHidden = 16, kOut = 6;
  nn::Linear fc1(kIn, kHidden, Device::cpu, 1), fc2(kHidden, kOut, Device::cpu, 2);
  parallel::ColumnParallelLinear column(fc1, tp);
  parallel::RowParallelLinear row(fc2, tp);
  const Tensor input = Tensor::randn({kBatch, kIn}, 3), target = Tensor::randn({kBatch, kOut}, 4);

  Tensor x_full = input.clone();
  x_full.set_requires_grad(true);
  Tensor y_full = fc2(gelu(fc1(x_full)));
  mse_loss(y_full, target).backward();

  Tensor x = input.clone();
  x.set_requires_grad(true);
  const std::int64_t before = tp.bytes_sent();
  Tensor y = row(gelu(column(x)));
  const std::int64_t forward_bytes = tp.bytes_sent() - before;
  mse_loss(y, target).backward();
  const std::int64_t backward_bytes = tp.bytes_sent() - before - forward_bytes;

  EXPECT_LE(verify::max_abs_diff(y.to_host(), y_full.to_host()), kReorderTolerance);
  EXPECT_LE(verify::max_abs_diff(x.grad().to_host(), x_full.grad().to_host()), kReorderTolerance);
  const std::int64_t part = kHidden / n;
  EXPECT_EQ(column.weight.shape(), (Shape{part, kIn}));
  EXPECT_EQ(row.weight.shape(), (Shape{kOut, part}));
  EXPECT_LE(verify::max_abs_diff(column.weight.grad().to_host(), rows_of(fc1.weight.grad(), r * part, part)), kReorderTolerance);
  EXPECT_LE(verify::max_abs_diff(column.bias.grad().to_host(), rows_of(fc1.bias.grad(), r * part, part)),
            kReorderTolerance);
  EXPECT_LE(verify::max_abs_diff(row.weight.grad().to_host(), columns_of(fc2.weight.grad(), r * part, part)), kReorderTolerance);
  EXPECT_LE(verify::max_abs_diff(row.bias.grad().to_host(), fc2.bias.grad().to_host()), kReorderTolerance);
  // g all-reduces the output forward, f the input's gradient backward, and nothing else moves.
  EXPECT_EQ(forward_bytes, n > 1 ? kBatch * kOut * 4 : 0);
  EXPECT_EQ(backward_bytes, n > 1 ? kBatch * kIn * 4 : 0);
}

TEST(TensorParallel, TheVocabularySplitsAndTheLogitsNeverMeet) {
  comm::Communicator& tp = world();
  const int n = tp.size(), r = tp.rank();
  constexpr std::int64_t kVocab = 12, kDim = 8, kRows = 10;
  const Tensor table = Tensor::randn({kVocab, kDim}, 5);
  std::vector<float> ids(kRows), targets(kRows);
  for (std::int64_t i = 0; i < kRows; ++i) {
    ids[static_cast<std::size_t>(i)] = static_cast<float>((i * 5 + 1) % kVocab);
    targets[static_cast<std::size_t>(i)] = i == 3 ? -100.0f : static_cast<float>((i * 7 + 2) % kVocab);  // one row ignored
  }
  const Tensor id_tensor = Tensor::from_host(ids, {kRows}), target_tensor = Tensor::from_host(targets, {kRows});

  // Unsharded: embedding, the tied head, cross-entropy.
  Tensor full = table.clone();
  full.set_requires_grad(true);
  Tensor full_logits = matmul(embedding(id_tensor, full), full, false, true);
  Tensor full_loss = cross_entropy(full_logits, target_tensor);
  full_loss.backward();

  parallel::VocabParallelEmbedding sharded(table, tp);
  const std::int64_t part = kVocab / n;
  EXPECT_EQ(sharded.first_row(), r * part);
  Tensor x = sharded(id_tensor);
  // Only one rank holds each row; the others add zeros: the same bits as the unsharded lookup.
  EXPECT_EQ(x.to_host(), embedding(id_tensor, table).to_host());
  Tensor logits = sharded.logits(x);
  EXPECT_EQ(logits.shape(), (Shape{kRows, part}));
  const std::int64_t before = tp.bytes_sent();
  Tensor loss = parallel::parallel_cross_entropy(logits, target_tensor, sharded.first_row(), tp);
  // The row maxima, then the sums of exponentials and the target logits: 3 floats a row, never V.
  EXPECT_EQ(tp.bytes_sent() - before, n > 1 ? 3 * kRows * 4 : 0);
  EXPECT_NEAR(loss.item(), full_loss.item(), kReorderTolerance);
  loss.backward();
  EXPECT_LE(verify::max_abs_diff(sharded.weight.grad().to_host(), rows_of(full.grad(), r * part, part)), kReorderTolerance);
}

TEST(TensorParallel, ParallelCrossEntropyIsCrossEntropyOnEachSlice) {
  comm::Communicator& tp = world();
  const int n = tp.size(), r = tp.rank();
  constexpr std::int64_t kRows = 7, kVocab = 16;
  const Tensor logits = scale(Tensor::randn({kRows, kVocab}, 9), 4.0f);  // far from uniform
  std::vector<float> targets(kRows);
  for (std::int64_t i = 0; i < kRows; ++i) targets[static_cast<std::size_t>(i)] = static_cast<float>((i * 3) % kVocab);
  const Tensor target_tensor = Tensor::from_host(targets, {kRows});
  Tensor full = logits.clone();
  full.set_requires_grad(true);
  Tensor expected = cross_entropy(full, target_tensor);
  expected.backward();
  const std::int64_t part = kVocab / n;
  Tensor mine = Tensor::from_host(columns_of(logits, r * part, part), {kRows, part});
  mine.set_requires_grad(true);
  Tensor loss = parallel::parallel_cross_entropy(mine, target_tensor, r * part, tp);
  EXPECT_NEAR(loss.item(), expected.item(), kReorderTolerance);
  loss.backward();
  EXPECT_LE(verify::max_abs_diff(mine.grad().to_host(), columns_of(full.grad(), r * part, part)), kReorderTolerance);
}

// The whole GPT split by TP is a one-stage pipeline (PipelineStageGPT over a pipeline of one rank).
// With sequence parallelism as well, the layer norms and residual adds run on each rank's quarter or
// half of the sequence; once the whole parameters' partial gradients are added over the group, every
// gradient is again the whole model's.
TEST(TensorParallel, TheGptSplitByHeadsAndHiddenUnitsIsTheGpt) {
  comm::Communicator& tp = world();
  auto alone = tp.split(tp.rank(), 0);  // a pipeline of one stage
  nn::GPTConfig config;
  config.n_layer = 2, config.n_head = 4, config.n_embd = 32, config.block_size = 8, config.vocab_size = 12;
  nn::GPT full(config, Device::cpu, 7);
  std::vector<float> ids(3 * 8), targets(3 * 8);
  for (std::size_t i = 0; i < ids.size(); ++i) {
    ids[i] = static_cast<float>((i * 7 + 3) % 12);
    targets[i] = i % 5 == 0 ? -100.0f : static_cast<float>((i * 5 + 1) % 12);
  }
  const Tensor id_tensor = Tensor::from_host(ids, {3, 8}), target_tensor = Tensor::from_host(targets, {24});
  Tensor expected = cross_entropy(full(id_tensor), target_tensor);
  expected.backward();
  std::map<std::string, Tensor> whole;
  for (const auto& [name, p] : full.named_parameters()) whole[name] = p.grad();

  for (const bool sequence_parallel : {false, true}) {
    SCOPED_TRACE(sequence_parallel ? "sequence parallel" : "tensor parallel");
    parallel::PipelineStageGPT sharded(full, *alone, &tp, sequence_parallel);
    Tensor loss = sharded.loss(sharded(id_tensor), target_tensor, -100);
    EXPECT_NEAR(loss.item(), expected.item(), kReorderTolerance);
    loss.backward();
    if (sequence_parallel && tp.size() > 1) {
      // Before the sum over the group, a layer norm's gradient is only this rank's shard's part of it.
      const std::string name = "transformer.h.0.ln_1.weight";
      for (const auto& [n, p] : sharded.named_parameters()) {
        if (n == name) {
          EXPECT_GT(verify::max_abs_diff(p.grad().to_host(), whole[name].to_host()), 1e-4) << name;
        }
      }
    }
    sharded.sync_sequence_parallel_gradients();
    // Every sharded gradient is the matching part of the whole model's; the rest are whole on every rank.
    std::size_t checked = 0;
    for (const auto& [name, p] : sharded.named_parameters()) {
      ASSERT_TRUE(whole.count(name)) << name;
      const Tensor part = sharded.part_of(name, whole[name]);
      EXPECT_EQ(sharded.is_split(name), tp.size() > 1 && part.numel() < whole[name].numel()) << name;
      EXPECT_EQ(p.shape(), part.shape()) << name;
      EXPECT_LE(verify::max_abs_diff(p.grad().to_host(), part.to_host()), kReorderTolerance) << name;
      ++checked;
    }
    EXPECT_EQ(checked, full.named_parameters().size());
  }
}

// In bfloat16 a split layer rounds otherwise than the whole one (each rank's partial product rounded
// before the ranks add them, a row layer's bias added after that sum), so the whole GPT's gradient of a
// micro-batch is not the split run's. The reference that runs the split model's TP ranks on threads of
// one process (verify/model_parallel_reference.h) gives the run's loss and every gradient bit for bit,
// and reports the terms of each gradient (under sequence parallelism an unsplit parameter's is every
// rank's term). At 4 ranks MPI adds the loss's float32 sums (the softmax over the vocabulary's shards) in
// an order of its own, which no reference repeats (its 16-bit sums both add in the ring's order: comm_test):
// there the reference runs in float32 and agrees within the reordering's tolerance.
TEST(TensorParallel, TheInProcessReferenceRoundsAsTheRanksDo) {
  comm::Communicator& tp = world();
  const bool exact = tp.size() <= 2;
  const DType precision = exact ? DType::bfloat16 : DType::float32;
  auto alone = tp.split(tp.rank(), 0);
  nn::GPTConfig config;
  config.n_layer = 2, config.n_head = 4, config.n_embd = 32, config.block_size = 8, config.vocab_size = 12;
  std::vector<float> ids(3 * 8), targets(3 * 8);
  for (std::size_t i = 0; i < ids.size(); ++i) {
    ids[i] = static_cast<float>((i * 7 + 3) % 12);
    targets[i] = i % 5 == 0 ? -100.0f : static_cast<float>((i * 5 + 1) % 12);
  }
  const Tensor id_tensor = Tensor::from_host(ids, {3, 8}), target_tensor = Tensor::from_host(targets, {24});
  const auto backward = [&](parallel::PipelineStageGPT& stage) {
    Tensor loss;
    {
      Autocast autocast(precision);
      loss = stage.loss(stage(id_tensor), target_tensor, -100);
    }
    loss.backward();
    return loss.item();
  };
  for (const bool sequence_parallel : {false, true}) {
    SCOPED_TRACE(sequence_parallel ? "sequence parallel" : "tensor parallel");
    nn::GPT full(config, Device::cpu, 7);
    parallel::PipelineStageGPT sharded(full, *alone, &tp, sequence_parallel);
    const float run_loss = backward(sharded);
    parallel::finish_gradients(sharded);
    verify::WholeModelGather gather(sharded, full, tp,
                                      [&](const std::string& name) { return sharded.is_split(name) || tp.rank() == 0; });
    const std::vector<float> run = gather.gradients();

    verify::LocalGroup pipeline_of_one(1);
    verify::ModelParallelReference reference(
        tp.size(), 1, parallel::ContextMethod::ring,
        [&](comm::Communicator& member, const parallel::ContextParallel*) {
          return std::make_shared<parallel::PipelineStageGPT>(full, pipeline_of_one.member(0), &member, sequence_parallel);
        },
        full, sequence_parallel);
    full.zero_grad();
    verify::ContributionMagnitudes terms;
    const float reference_loss = reference.backward(full, [&](parallel::TensorParallelModule& part) {
      return backward(dynamic_cast<parallel::PipelineStageGPT&>(part));
    });
    if (tp.rank() != 0) continue;
    const std::vector<float> ours = full.gradients_to_host();
    ASSERT_EQ(ours.size(), run.size());
    if (!exact) {
      EXPECT_NEAR(reference_loss, run_loss, kReorderTolerance);
      EXPECT_LE(verify::max_abs_diff(ours, run), kReorderTolerance);
      continue;
    }
    EXPECT_EQ(reference_loss, run_loss);
    std::size_t differ = 0;
    for (std::size_t i = 0; i < ours.size(); ++i) differ += ours[i] != run[i];
    EXPECT_EQ(differ, 0u) << "of " << ours.size();
    for (const auto& [name, p] : full.named_parameters()) {
      if (name == "transformer.h.0.ln_1.weight") {  // unsplit: two terms under sequence parallelism, one otherwise
        EXPECT_EQ(terms.count(p), sequence_parallel ? tp.size() : 1) << name;
      }
      if (name == "transformer.wte.weight") {
        EXPECT_EQ(terms.count(p), 2) << name;  // the table and the tied head
      }
    }

    // The whole GPT's own bfloat16 gradient of the micro-batch: the same at one rank, not at two.
    nn::GPT whole(config, Device::cpu, 7);
    {
      Tensor loss;
      {
        Autocast autocast(DType::bfloat16);
        loss = cross_entropy(whole(id_tensor), target_tensor);
      }
      loss.backward();
    }
    const std::vector<float> unsharded = whole.gradients_to_host();
    std::size_t unsharded_differ = 0;
    for (std::size_t i = 0; i < ours.size(); ++i) unsharded_differ += unsharded[i] != run[i];
    if (tp.size() == 1 && !sequence_parallel) {
      EXPECT_EQ(unsharded_differ, 0u);
    }
    if (tp.size() == 2) {
      EXPECT_GT(unsharded_differ, ours.size() / 10) << "of " << ours.size();
    }
  }
}

// Sequence parallelism's f and g: gathering the shards is their concatenation along the sequence,
// its backward the sum of every rank's gradient of this rank's shard (a reduce-scatter);
// reduce-scattering is the sum of every rank's tensor, this rank's shard of it, its backward the
// concatenation of every rank's gradient (an all-gather).
TEST(TensorParallel, SequenceShardsGatherAndReduceScatter) {
  comm::Communicator& tp = world();
  const int n = tp.size(), r = tp.rank();
  constexpr std::int64_t kB = 2, kShard = 3, kC = 4;
  const std::int64_t t = kShard * n;
  auto of_rank = [](int rank, const Shape& shape) { return Tensor::randn(shape, 100 + static_cast<std::uint64_t>(rank)); };
  auto shard_rows = [&](const Tensor& whole, int rank) {  // [B, T, C] -> [B, kShard, C] of `rank`
    const auto v = whole.to_host();
    std::vector<float> out;
    for (std::int64_t b = 0; b < kB; ++b)
      out.insert(out.end(), v.begin() + (b * t + rank * kShard) * kC, v.begin() + (b * t + (rank + 1) * kShard) * kC);
    return out;
  };

  Tensor mine = of_rank(r, {kB, kShard, kC});
  mine.set_requires_grad(true);
  Tensor gathered = parallel::gather_sequence(mine, tp);
  ASSERT_EQ(gathered.shape(), (Shape{kB, t, kC}));
  for (int k = 0; k < n; ++k) EXPECT_EQ(shard_rows(gathered, k), of_rank(k, {kB, kShard, kC}).to_host()) << "shard " << k;
  const Tensor weight = Tensor::randn({kB, t, kC}, 7);  // the same on every rank
  sum(mul(gathered, weight)).backward();
  std::vector<float> expected = shard_rows(weight, r);
  for (float& w : expected) w *= static_cast<float>(n);  // every rank's gradient of this shard, summed
  EXPECT_LE(verify::max_abs_diff(mine.grad().to_host(), expected), kReorderTolerance);

  Tensor whole = of_rank(r, {kB, t, kC});
  whole.set_requires_grad(true);
  Tensor scattered = parallel::reduce_scatter_sequence(whole, tp);
  ASSERT_EQ(scattered.shape(), (Shape{kB, kShard, kC}));
  std::vector<float> total(static_cast<std::size_t>(kB * kShard * kC), 0.0f);
  for (int k = 0; k < n; ++k) {
    const auto part = shard_rows(of_rank(k, {kB, t, kC}), r);
    for (std::size_t i = 0; i < total.size(); ++i) total[i] += part[i];
  }
  EXPECT_LE(verify::max_abs_diff(scattered.to_host(), total), kReorderTolerance);
  sum(mul(scattered, of_rank(r, {kB, kShard, kC}))).backward();
  for (int k = 0; k < n; ++k)
    EXPECT_EQ(shard_rows(whole.grad(), k), of_rank(k, {kB, kShard, kC}).to_host()) << "shard " << k;
}

// The house-price MLP split in column-then-row pairs: 2 hidden layers leave its last linear layer
// whole on every rank, 3 pair all four.
TEST(TensorParallel, TheMlpSplitInPairsIsTheMlp) {
  comm::Communicator& tp = world();
  for (const int hidden_layers : {2, 3}) {
    SCOPED_TRACE(std::to_string(hidden_layers) + " hidden layers");
    auto full = nn::make_mlp(6, 16, hidden_layers, 1, nn::Activation::relu, Device::cpu, 11);
    parallel::TensorParallelMLP sharded(*full, tp);
    const Tensor input = Tensor::randn({5, 6}, 12), target = Tensor::randn({5, 1}, 13);
    Tensor y_full = (*full)(input);
    mse_loss(y_full, target).backward();
    Tensor y = sharded(input);
    EXPECT_LE(verify::max_abs_diff(y.to_host(), y_full.to_host()), kReorderTolerance);
    mse_loss(y, target).backward();
    std::map<std::string, Tensor> whole;
    for (const auto& [name, p] : full->named_parameters()) whole[name] = p.grad();
    std::size_t split = 0;
    for (const auto& [name, p] : sharded.named_parameters()) {
      ASSERT_TRUE(whole.count(name)) << name;
      const Tensor part = sharded.part_of(name, whole[name]);
      split += sharded.is_split(name);
      EXPECT_EQ(p.shape(), part.shape()) << name;
      EXPECT_LE(verify::max_abs_diff(p.grad().to_host(), part.to_host()), kReorderTolerance) << name;
    }
    EXPECT_EQ(sharded.named_parameters().size(), whole.size());
    // Each pair splits the column layer's weight and bias and the row layer's weight.
    EXPECT_EQ(split, tp.size() > 1 ? 3u * static_cast<std::size_t>((hidden_layers + 1) / 2) : 0u);
  }
}

TEST(TensorParallel, WhatDoesNotDivideIsNamed) {
  nn::Linear odd(3, 5, Device::cpu, 1);  // 5 output features, 3 input features: no split of 2 or 4
  if (world().size() == 1) {  // everything divides among 1 rank
    EXPECT_NO_THROW(parallel::ColumnParallelLinear(odd, world()));
    return;
  }
  try {
    parallel::ColumnParallelLinear column(odd, world());
    FAIL() << "5 output features split among " << world().size();
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("ColumnParallelLinear: out_features: 5 does not divide among"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(parallel::RowParallelLinear(odd, world()), UsageError);
}

}  // namespace
}  // namespace course::testing

COURSE_MPI_TEST_MAIN()
