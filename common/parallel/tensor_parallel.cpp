// The f and g operators and the two parallel linear layers.
#include "common/parallel/tensor_parallel.h"

#include <cmath>

#include "common/autograd/autograd.h"
#include "common/core/errors.h"
#include "common/core/memory.h"
#include "common/kernels/kernels.h"
#include "common/ops/autocast.h"
#include "common/ops/ops.h"
#include "common/faults/faults.h"

namespace course::parallel {

Tensor copy_to_tensor_parallel(const Tensor& x, comm::Communicator& tp) {
  Tensor out = x.detach();
  return autograd::record(out, "tp_copy (f)", {x}, [&tp](const Tensor& g) {
    Tensor sum = g.clone();
    if (tp.size() > 1) tp.all_reduce(sum, comm::ReduceOp::sum);
    return std::vector<Tensor>{sum};
  });
}

Tensor reduce_from_tensor_parallel(const Tensor& x, comm::Communicator& tp) {
  Tensor sum = x.detach().clone();
  if (tp.size() > 1) tp.all_reduce(sum, comm::ReduceOp::sum);
  return autograd::record(sum, "tp_reduce (g)", {x}, [](const Tensor& g) { return std::vector<Tensor>{g}; });
}

namespace {

// [B, T, rest...] as [T, B, rest] (a copy): the sequence first, so that each rank's shard of it is one
// contiguous block for the collectives (Megatron-LM keeps its activations [s, b, h] for this reason).
Tensor sequence_first(const Tensor& x) {
  const std::int64_t batch = x.dim(0), t = x.dim(1);
  return permute(reshape(x, {batch, t, x.numel() / (batch * t)}), {1, 0, 2});
}
// Back: [T', B, rest] -> [B, T', rest...] with the trailing dimensions of `like`.
Tensor batch_first(const Tensor& x, const Shape& like) {
  Shape shape = like;
  shape[1] = x.dim(0);
  return reshape(permute(x, {1, 0, 2}), shape);
}

void check_sequence(const Tensor& x, std::int64_t divide_by, const char* what) {
  if (x.shape().size() < 2 || (divide_by > 1 && x.dim(1) % divide_by != 0))
    throw std::invalid_argument(std::string(what) + ": " + shape_string(x.shape()) + " is not [B, T, ...] with T divisible by " +
                                std::to_string(divide_by));
}

// The collectives themselves, on tensors outside the graph.
Tensor all_gather_sequence(const Tensor& x, comm::Communicator& tp) {
  Tensor shard = sequence_first(x);
  Shape whole_shape = shard.shape();
  whole_shape[0] *= tp.size();
  Tensor whole = Tensor::empty(whole_shape, x.device(), x.dtype());
  tp.all_gather(shard, whole);
  if (tp.size() > 1 && faults::active("sp-gather-rows")) {  // --fault sp-gather-rows: block k gets k + 1's rows
    Tensor moved = Tensor::empty(whole_shape, x.device(), x.dtype());
    const auto block = static_cast<std::size_t>(shard.numel());
    for (int k = 0; k < tp.size(); ++k)
      moved.view(static_cast<std::size_t>(k) * block, shard.shape())
          .copy_from(whole.view(static_cast<std::size_t>((k + 1) % tp.size()) * block, shard.shape()));
    whole = moved;
  }
  return batch_first(whole, x.shape());
}
Tensor reduce_scatter_of_sequence(const Tensor& x, comm::Communicator& tp) {
  Tensor whole = sequence_first(x);
  Shape shard_shape = whole.shape();
  shard_shape[0] /= tp.size();
  Tensor shard = Tensor::empty(shard_shape, x.device(), x.dtype());
  tp.reduce_scatter(whole, shard, comm::ReduceOp::sum);
  return batch_first(shard, x.shape());
}

}  // namespace

Tensor gather_sequence(const Tensor& x, comm::Communicator& tp) {
  check_sequence(x, 1, "gather_sequence");
  if (tp.size() == 1) return x;
  return autograd::record(all_gather_sequence(x.detach(), tp), "sp_gather (f)", {x},
                          [&tp](const Tensor& g) { return std::vector<Tensor>{reduce_scatter_of_sequence(g, tp)}; });
}

Tensor reduce_scatter_sequence(const Tensor& x, comm::Communicator& tp) {
  check_sequence(x, tp.size(), "reduce_scatter_sequence");
  if (tp.size() == 1) return x;
  return autograd::record(reduce_scatter_of_sequence(x.detach(), tp), "sp_reduce_scatter (g)", {x},
                          [&tp](const Tensor& g) { return std::vector<Tensor>{all_gather_sequence(g, tp)}; });
}

void all_reduce_gradients(const std::vector<Tensor>& parameters, comm::Communicator& tp) {
  if (tp.size() == 1) return;
  std::size_t total = 0;
  Device device = Device::cpu;
  for (const Tensor& p : parameters)
    if (p.grad().defined()) total += static_cast<std::size_t>(p.numel()), device = p.device();
  if (total == 0) return;
  Tensor flat = Tensor::empty({static_cast<std::int64_t>(total)}, device);
  autograd::NoGradGuard no_grad;
  std::size_t at = 0;
  for (const Tensor& p : parameters)
    if (p.grad().defined()) {
      flat.view(at, p.shape()).copy_from(p.grad());
      at += static_cast<std::size_t>(p.numel());
    }
  tp.all_reduce(flat, comm::ReduceOp::sum);
  at = 0;
  for (const Tensor& p : parameters)
    if (p.grad().defined()) {
      Tensor g = p.grad();
      g.copy_from(flat.view(at, p.shape()));
      at += static_cast<std::size_t>(p.numel());
    }
}

Tensor shard_of(const Tensor& full, int dim, comm::Communicator& tp, const char* what) {
  const auto& shape = full.shape();
  const std::int64_t n = shape.at(static_cast<std::size_t>(dim)), parts = tp.size();
  if (n % parts != 0)
    throw UsageError(std::string(what) + ": " + std::to_string(n) + " does not divide among " + std::to_string(parts) +
                     " tensor-parallel ranks");
  const std::int64_t part = n / parts, first = part * tp.rank();
  std::int64_t outer = 1, inner = 1;
  for (int d = 0; d < dim; ++d) outer *= shape[static_cast<std::size_t>(d)];
  for (std::size_t d = static_cast<std::size_t>(dim) + 1; d < shape.size(); ++d) inner *= shape[d];
  const auto values = full.to_host();
  std::vector<float> mine;
  mine.reserve(static_cast<std::size_t>(outer * part * inner));
  for (std::int64_t o = 0; o < outer; ++o) {
    const auto begin = values.begin() + (o * n + first) * inner;
    mine.insert(mine.end(), begin, begin + part * inner);
  }
  Shape sharded = shape;
  sharded[static_cast<std::size_t>(dim)] = part;
  MemoryCategoryScope scope(MemoryCategory::parameters);
  return Tensor::from_host(mine, sharded, full.device());
}

ColumnParallelLinear::ColumnParallelLinear(const nn::Linear& full, comm::Communicator& tp, bool sequence_parallel)
    : tp_(tp), sequence_parallel_(sequence_parallel) {
  weight = register_parameter("weight", shard_of(full.weight, 0, tp, "ColumnParallelLinear: out_features"));
  if (full.bias.defined()) bias = register_parameter("bias", shard_of(full.bias, 0, tp, "ColumnParallelLinear: out_features"));
}

ColumnParallelLinear::ColumnParallelLinear(const Tensor& weight_part, const Tensor& bias_part, comm::Communicator& tp,
                                           bool sequence_parallel)
    : tp_(tp), sequence_parallel_(sequence_parallel) {
  MemoryCategoryScope scope(MemoryCategory::parameters);
  weight = register_parameter("weight", weight_part.detach().clone());
  if (bias_part.defined()) bias = register_parameter("bias", bias_part.detach().clone());
}

Tensor ColumnParallelLinear::forward(const Tensor& x) {
  if (!sequence_parallel_ || tp_.size() == 1) return linear(copy_to_tensor_parallel(x, tp_), weight, bias);
  // linear(gather_sequence(x)) would keep the gathered input, the whole sequence, for backward, which
  // is what sequence parallelism set out to save. As Megatron-LM does (Korthikanti et al. 2022, section
  // 4.2.2), keep only this rank's shard and gather it again in backward, overlapped with computing dx.
  check_sequence(x, 1, "ColumnParallelLinear");
  Tensor y;
  {
    autograd::NoGradGuard no_grad;
    y = linear(all_gather_sequence(x.detach(), tp_), weight.detach(), bias.defined() ? bias.detach() : Tensor());
  }
  std::vector<Tensor> inputs{x, weight};
  if (bias.defined()) inputs.push_back(bias);
  // A 16-bit scope emulated (ops/autocast.h): the backward computes in float32 and rounds where the 16-bit
  // path's rounds, y's gradient included (the 16-bit path's y is 16-bit).
  const DType emulated = emulated_kept_type();
  return autograd::record(
      y, "sp_gather_linear", inputs, [x = x.detach(), w = weight.detach(), has_bias = bias.defined(), &tp = tp_, emulated](const Tensor& g) {
        autograd::NoGradGuard no_grad;
        // Megatron-LM's overlap: the input's all-gather travels while dx = dy W is computed (dx does
        // not need it), and dx's reduce-scatter while dW = dy^T x is.
        Shape whole_shape = x.shape();
        whole_shape[1] *= tp.size();
        const Tensor shard = sequence_first(x);
        Shape gathered_shape = shard.shape();
        gathered_shape[0] *= tp.size();
        Tensor gathered = Tensor::empty(gathered_shape, g.device(), shard.dtype());
        comm::WorkHandle gathering = tp.all_gather_async(shard, gathered);
        const std::int64_t in = w.dim(1), out = w.dim(0), rows = x.numel() * tp.size() / in;
        // In the type the forward computed in: under autocast the 16-bit copies of W and x, as linear's
        // own backward (the engine widens dW to the parameter's type).
        const Tensor wt = rounded_to(w.to(g.dtype()), emulated), dy = reshape(rounded_to(g, emulated), {rows, out});
        std::vector<Tensor> grads(has_bias ? 3 : 2);
        // dx = dy W, then each rank's shard of the sum (emulated: the sum in 16 bits, as the path's)
        const Tensor dx = reshape(rounded_to(matmul(dy, wt), emulated), whole_shape);
        const Tensor dx_by_sequence = emulated == DType::float32 ? sequence_first(dx) : sequence_first(dx).to(emulated);
        Shape dx_shard_shape = dx_by_sequence.shape();
        dx_shard_shape[0] /= tp.size();
        Tensor dx_shard = Tensor::empty(dx_shard_shape, g.device(), dx_by_sequence.dtype());
        comm::WorkHandle scattering = tp.reduce_scatter_async(dx_by_sequence, dx_shard, comm::ReduceOp::sum);
        gathering->wait();
        const Tensor whole = rounded_to(batch_first(gathered, whole_shape).to(g.dtype()), emulated);
        grads[1] = rounded_to(matmul(dy, reshape(whole, {rows, in}), true, false), emulated);  // dW = dy^T x
        if (has_bias) {  // db = the column sums of dy, in float32
          const Tensor wide = dy.to(DType::float32);
          grads[2] = Tensor::empty({out}, g.device());
          kernels(g.device()).sum_rows(wide.data(), static_cast<std::size_t>(rows), static_cast<std::size_t>(out), grads[2].data());
        }
        scattering->wait();
        grads[0] = batch_first(emulated == DType::float32 ? dx_shard : dx_shard.to(DType::float32), x.shape());
        return grads;
      });
}

RowParallelLinear::RowParallelLinear(const nn::Linear& full, comm::Communicator& tp, bool sequence_parallel)
    : tp_(tp), sequence_parallel_(sequence_parallel) {
  weight = register_parameter("weight", shard_of(full.weight, 1, tp, "RowParallelLinear: in_features"));
  if (full.bias.defined()) {
    MemoryCategoryScope scope(MemoryCategory::parameters);
    bias = register_parameter("bias", full.bias.detach().clone());
  }
}

Tensor RowParallelLinear::forward(const Tensor& x) {
  Tensor partial = linear(x, weight, Tensor());
  if (tp_.size() > 1 && faults::active("row-parallel-no-sum")) {  // --fault row-parallel-no-sum
    if (sequence_parallel_) {  // this rank's shard of the sequence, of its own partial product only
      check_sequence(partial, tp_.size(), "RowParallelLinear");
      const std::int64_t shard = partial.dim(1) / tp_.size();
      partial = batch_first(narrow(sequence_first(partial), shard * tp_.rank(), shard), partial.shape());
    }
    return bias.defined() ? add(partial, bias) : partial;
  }
  // The partial products are 16-bit under autocast, and so is their sum (emulated: through_sixteen_bits).
  const Tensor sum = through_sixteen_bits(partial, [&](const Tensor& part) {
    return sequence_parallel_ ? reduce_scatter_sequence(part, tp_) : reduce_from_tensor_parallel(part, tp_);
  });
  return bias.defined() ? add(sum, bias) : sum;
}

VocabParallelEmbedding::VocabParallelEmbedding(const Tensor& full_table, comm::Communicator& tp, bool sequence_parallel)
    : tp_(tp), sequence_parallel_(sequence_parallel) {
  weight = register_parameter("weight", shard_of(full_table, 0, tp, "VocabParallelEmbedding: vocab_size"));
  first_ = weight.dim(0) * tp.rank();
}

Tensor VocabParallelEmbedding::forward(const Tensor& ids) {
  // The ids this rank holds, renumbered from 0; the others point at row 0 and are masked out.
  const auto all = ids.to_host();
  const auto rows = weight.dim(0);
  std::vector<float> local(all.size()), mask(all.size());
  for (std::size_t i = 0; i < all.size(); ++i) {
    const auto id = static_cast<std::int64_t>(all[i]);
    const bool mine = id >= first_ && id < first_ + rows;
    local[i] = mine ? static_cast<float>(id - first_) : 0.0f;
    mask[i] = mine ? 1.0f : 0.0f;
  }
  Shape mask_shape = ids.shape();
  mask_shape.push_back(1);
  Tensor part = mul(embedding(Tensor::from_host(local, ids.shape(), ids.device()), weight),
                    Tensor::from_host(mask, mask_shape, ids.device()));
  return sequence_parallel_ ? reduce_scatter_sequence(part, tp_) : reduce_from_tensor_parallel(part, tp_);
}

Tensor VocabParallelEmbedding::logits(const Tensor& x) {
  Tensor whole = sequence_parallel_ ? gather_sequence(x, tp_) : copy_to_tensor_parallel(x, tp_);
  const std::int64_t c = whole.shape().back();
  return matmul(reshape(whole, {whole.numel() / c, c}), weight, false, true);
}

Tensor parallel_cross_entropy(const Tensor& local_logits, const Tensor& targets, std::int64_t first_column,
                              comm::Communicator& tp, int ignore_index) {
  if (local_logits.shape().size() != 2 || targets.numel() != local_logits.dim(0))
    throw std::invalid_argument("parallel_cross_entropy: logits " + shape_string(local_logits.shape()) +
                                " and targets " + shape_string(targets.shape()) + " do not fit ([N, V/size], [N])");
  const std::int64_t n = local_logits.dim(0), v = local_logits.dim(1);
  const Device device = local_logits.device();
  const auto logits = local_logits.to_host();
  const auto target = targets.to_host();
  // The row maxima first (for exp's range), then each row's sum of exponentials and its target's logit.
  std::vector<float> row_max(static_cast<std::size_t>(n), -INFINITY);
  for (std::int64_t i = 0; i < n; ++i)
    for (std::int64_t j = 0; j < v; ++j)
      row_max[static_cast<std::size_t>(i)] = std::max(row_max[static_cast<std::size_t>(i)], logits[static_cast<std::size_t>(i * v + j)]);
  Tensor max_t = Tensor::from_host(row_max, {n});
  if (tp.size() > 1) tp.all_reduce(max_t, comm::ReduceOp::max);
  const auto m = max_t.to_host();
  std::vector<float> sums(static_cast<std::size_t>(n), 0.0f), picked(static_cast<std::size_t>(n), 0.0f);
  for (std::int64_t i = 0; i < n; ++i) {
    double s = 0;
    for (std::int64_t j = 0; j < v; ++j) s += std::exp(static_cast<double>(logits[static_cast<std::size_t>(i * v + j)]) - m[static_cast<std::size_t>(i)]);
    sums[static_cast<std::size_t>(i)] = static_cast<float>(s);
    const auto t = static_cast<std::int64_t>(target[static_cast<std::size_t>(i)]);
    if (t >= first_column && t < first_column + v) picked[static_cast<std::size_t>(i)] = logits[static_cast<std::size_t>(i * v + t - first_column)];
  }
  // Two all-reduces of N floats each (joined in one buffer): the sums and the target logits.
  std::vector<float> both(sums);
  both.insert(both.end(), picked.begin(), picked.end());
  Tensor both_t = Tensor::from_host(both, {2 * n});
  if (tp.size() > 1) tp.all_reduce(both_t, comm::ReduceOp::sum);
  const auto reduced = both_t.to_host();
  double total = 0;
  std::int64_t counted = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    if (static_cast<int>(target[static_cast<std::size_t>(i)]) == ignore_index) continue;
    total += std::log(static_cast<double>(reduced[static_cast<std::size_t>(i)])) + m[static_cast<std::size_t>(i)] -
             reduced[static_cast<std::size_t>(n + i)];
    ++counted;
  }
  const float loss = counted > 0 ? static_cast<float>(total / static_cast<double>(counted)) : 0.0f;
  return autograd::record(
      Tensor::from_host({loss}, {1}, device), "parallel_cross_entropy", {local_logits},
      [logits, target, m, reduced, n, v, first_column, counted, ignore_index, device](const Tensor& g) {
        const float scale_by = g.to_host()[0] / static_cast<float>(std::max<std::int64_t>(counted, 1));
        std::vector<float> grad(static_cast<std::size_t>(n * v), 0.0f);
        for (std::int64_t i = 0; i < n; ++i) {
          const auto t = static_cast<std::int64_t>(target[static_cast<std::size_t>(i)]);
          if (static_cast<int>(target[static_cast<std::size_t>(i)]) == ignore_index) continue;
          const double sum = reduced[static_cast<std::size_t>(i)];
          for (std::int64_t j = 0; j < v; ++j) {
            const auto at = static_cast<std::size_t>(i * v + j);
            const double p = std::exp(static_cast<double>(logits[at]) - m[static_cast<std::size_t>(i)]) / sum;
            grad[at] = static_cast<float>((p - (j + first_column == t ? 1.0 : 0.0)) * scale_by);
          }
        }
        return std::vector<Tensor>{Tensor::from_host(grad, {n, v}, device)};
      });
}

void finish_gradients(TensorParallelModule& model) {
  // --fault skip-sp-sum, skip-tied-exchange (chapter 08): the run's model leaves a fix-up out.
  if (!faults::active("skip-sp-sum", &model)) model.sync_sequence_parallel_gradients();
  if (!faults::active("skip-tied-exchange", &model)) model.sync_tied_gradients();
}

}  // namespace course::parallel
