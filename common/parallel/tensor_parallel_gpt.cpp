// The tensor-parallel GPT: Megatron's split of every block, built from the whole model.
#include "common/parallel/tensor_parallel_gpt.h"

#include <cmath>

#include "common/core/errors.h"
#include "common/core/memory.h"
#include "common/ops/ops.h"

namespace course::parallel {
namespace {

// A module that only names the ones below it ("attn", "mlp"), as GPT-2's names nest.
struct Named : nn::Module {
  Tensor forward(const Tensor& x) override { return x; }
  using nn::Module::register_module;
};

}  // namespace

std::shared_ptr<nn::LayerNorm> copy_of(const nn::LayerNorm& full) {
  auto norm = std::make_shared<nn::LayerNorm>(full.weight.dim(0), full.weight.device());
  norm->weight.copy_from(full.weight);
  norm->bias.copy_from(full.bias);
  return norm;
}

Tensor shard_of_qkv(const Tensor& full, comm::Communicator& tp) {
  const std::int64_t rows = full.dim(0) / 3;
  if (full.dim(0) % 3 != 0) throw std::invalid_argument("shard_of_qkv: " + shape_string(full.shape()) + " is not [3C, ...]");
  std::vector<float> mine;
  Shape part_shape = full.shape();
  for (std::int64_t i = 0; i < 3; ++i) {  // the queries', then the keys', then the values' rows of this rank's heads
    Tensor block = narrow(full.detach(), i * rows, rows);
    const auto values = shard_of(block, 0, tp, "attention heads").to_host();
    mine.insert(mine.end(), values.begin(), values.end());
  }
  part_shape[0] = full.dim(0) / tp.size();
  MemoryCategoryScope scope(MemoryCategory::parameters);
  return Tensor::from_host(mine, part_shape, full.device());
}

TensorParallelBlock::TensorParallelBlock(const nn::Block& full, const nn::GPTConfig& config, comm::Communicator& tp)
    : local_heads_(config.n_head / tp.size()) {
  ln_1_ = register_module("ln_1", copy_of(*full.ln_1));
  auto attn = register_module("attn", std::make_shared<Named>());
  c_attn_ = attn->register_module("c_attn", std::make_shared<ColumnParallelLinear>(
                                                shard_of_qkv(full.attn->c_attn->weight, tp),
                                                shard_of_qkv(full.attn->c_attn->bias, tp), tp));
  attn_proj_ = attn->register_module("c_proj", std::make_shared<RowParallelLinear>(*full.attn->c_proj, tp));
  ln_2_ = register_module("ln_2", copy_of(*full.ln_2));
  auto mlp = register_module("mlp", std::make_shared<Named>());
  c_fc_ = mlp->register_module("c_fc", std::make_shared<ColumnParallelLinear>(*full.mlp->c_fc, tp));
  mlp_proj_ = mlp->register_module("c_proj", std::make_shared<RowParallelLinear>(*full.mlp->c_proj, tp));
}

// nn::CausalSelfAttention's arithmetic on this rank's heads; the row-parallel projection sums them.
Tensor TensorParallelBlock::attention(const Tensor& x) {
  const std::int64_t batch = x.dim(0), t = x.dim(1), c = x.dim(2);
  const std::int64_t local_c = c_attn_->weight.dim(0) / 3, head_size = local_c / local_heads_;
  Tensor qkv = (*c_attn_)(reshape(x, {batch * t, c}));  // [B*T, 3 C/size]
  qkv = permute(reshape(qkv, {batch, t, 3, local_heads_, head_size}), {2, 0, 3, 1, 4});
  auto part = [&](std::int64_t i) { return reshape(narrow(qkv, i, 1), {batch * local_heads_, t, head_size}); };
  Tensor q = part(0), k = part(1), v = part(2);
  Tensor att = softmax(scale(bmm(q, k, false, true), 1.0f / std::sqrt(static_cast<float>(head_size))), true);
  Tensor y = bmm(att, v);
  y = reshape(permute(reshape(y, {batch, local_heads_, t, head_size}), {0, 2, 1, 3}), {batch * t, local_c});
  return reshape((*attn_proj_)(y), {batch, t, c});
}

Tensor TensorParallelBlock::mlp(const Tensor& x) {
  const std::int64_t batch = x.dim(0), t = x.dim(1), c = x.dim(2);
  Tensor h = gelu((*c_fc_)(reshape(x, {batch * t, c})), GeluApproximate::tanh);
  return reshape((*mlp_proj_)(h), {batch, t, c});
}

Tensor TensorParallelBlock::forward(const Tensor& x) {
  Tensor h = add(x, attention((*ln_1_)(x)));
  return add(h, mlp((*ln_2_)(h)));
}

void check_tensor_parallel(const nn::GPTConfig& config, int ranks) {
  if (config.n_head % ranks != 0)
    throw UsageError("--n-head: " + std::to_string(config.n_head) + " heads do not divide among " +
                     std::to_string(ranks) + " tensor-parallel ranks");
  if (config.vocab_size % ranks != 0)
    throw UsageError("vocabulary: " + std::to_string(config.vocab_size) + " tokens do not divide among " +
                     std::to_string(ranks) + " tensor-parallel ranks");
  if (config.dropout != 0.0f)
    throw UsageError("dropout: tensor parallelism here needs dropout off (each rank's mask would differ)");
}

TensorParallelGPT::TensorParallelGPT(const nn::GPT& full, comm::Communicator& tp) : config_(full.config()), tp_(tp) {
  check_tensor_parallel(config_, tp.size());
  wte_ = register_module("wte", std::make_shared<VocabParallelEmbedding>(full.wte, tp));
  {
    MemoryCategoryScope scope(MemoryCategory::parameters);
    wpe_ = register_parameter("wpe.weight", full.wpe.detach().clone());
  }
  auto layers = register_module("h", std::make_shared<Named>());
  for (std::size_t i = 0; i < full.blocks().size(); ++i)
    blocks_.push_back(layers->register_module(std::to_string(i), std::make_shared<TensorParallelBlock>(*full.blocks()[i], config_, tp)));
  ln_f_ = register_module("ln_f", copy_of(full.ln_f()));
}

Tensor TensorParallelGPT::forward(const Tensor& ids) {
  const std::int64_t batch = ids.dim(0), t = ids.dim(1), c = config_.n_embd;
  std::vector<float> positions(static_cast<std::size_t>(t));
  for (std::int64_t i = 0; i < t; ++i) positions[static_cast<std::size_t>(i)] = static_cast<float>(i);
  Tensor x = add((*wte_)(ids), embedding(Tensor::from_host(positions, {t}, ids.device()), wpe_));
  for (auto& block : blocks_) x = (*block)(x);
  x = (*ln_f_)(x);
  return wte_->logits(reshape(x, {batch * t, c}));
}

Tensor TensorParallelGPT::loss(const Tensor& ids, const Tensor& targets, int ignore_index) {
  return parallel_cross_entropy(forward(ids), targets, wte_->first_row(), tp_, ignore_index);
}

}  // namespace course::parallel
