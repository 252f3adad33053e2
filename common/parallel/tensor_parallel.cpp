// The f and g operators and the two parallel linear layers.
#include "common/parallel/tensor_parallel.h"

#include "common/autograd/autograd.h"
#include "common/core/errors.h"
#include "common/core/memory.h"
#include "common/ops/ops.h"

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

ColumnParallelLinear::ColumnParallelLinear(const nn::Linear& full, comm::Communicator& tp) : tp_(tp) {
  weight = register_parameter("weight", shard_of(full.weight, 0, tp, "ColumnParallelLinear: out_features"));
  if (full.bias.defined()) bias = register_parameter("bias", shard_of(full.bias, 0, tp, "ColumnParallelLinear: out_features"));
}

Tensor ColumnParallelLinear::forward(const Tensor& x) { return linear(copy_to_tensor_parallel(x, tp_), weight, bias); }

RowParallelLinear::RowParallelLinear(const nn::Linear& full, comm::Communicator& tp) : tp_(tp) {
  weight = register_parameter("weight", shard_of(full.weight, 1, tp, "RowParallelLinear: in_features"));
  if (full.bias.defined()) {
    MemoryCategoryScope scope(MemoryCategory::parameters);
    bias = register_parameter("bias", full.bias.detach().clone());
  }
}

Tensor RowParallelLinear::forward(const Tensor& x) {
  Tensor partial = linear(x, weight, Tensor());
  Tensor sum = reduce_from_tensor_parallel(partial, tp_);
  return bias.defined() ? add(sum, bias) : sum;
}

}  // namespace course::parallel
