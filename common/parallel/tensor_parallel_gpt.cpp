// The tensor-parallel GPT: Megatron's split of every block, built from the whole model.
#include "common/parallel/tensor_parallel_gpt.h"

#include "common/autograd/checkpoint.h"

#include <cmath>

#include "common/core/errors.h"
#include "common/core/memory.h"
#include "common/faults/faults.h"
#include "common/ops/ops.h"

namespace course::parallel {

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

TensorParallelBlock::TensorParallelBlock(const nn::Block& full, const nn::GPTConfig& config, comm::Communicator& tp,
                                         bool sequence_parallel)
    : local_heads_(config.n_head / tp.size()), recompute_(config.recompute) {
  ln_1_ = register_module("ln_1", copy_of(*full.ln_1));
  auto attn = register_module("attn", std::make_shared<nn::ModuleDict>());
  c_attn_ = attn->register_module("c_attn", std::make_shared<ColumnParallelLinear>(
                                                shard_of_qkv(full.attn->c_attn->weight, tp),
                                                shard_of_qkv(full.attn->c_attn->bias, tp), tp, sequence_parallel));
  attn_proj_ = attn->register_module("c_proj", std::make_shared<RowParallelLinear>(*full.attn->c_proj, tp, sequence_parallel));
  ln_2_ = register_module("ln_2", copy_of(*full.ln_2));
  auto mlp = register_module("mlp", std::make_shared<nn::ModuleDict>());
  c_fc_ = mlp->register_module("c_fc", std::make_shared<ColumnParallelLinear>(*full.mlp->c_fc, tp, sequence_parallel));
  mlp_proj_ = mlp->register_module("c_proj", std::make_shared<RowParallelLinear>(*full.mlp->c_proj, tp, sequence_parallel));
}

// nn::CausalSelfAttention's arithmetic on this rank's heads; the row-parallel projection sums them.
// x is [B, T, C], or the sequence's shard [B, T / size, C], which c_attn gathers: the heads see the
// whole sequence either way.
Tensor TensorParallelBlock::attention(const Tensor& x) {
  Tensor qkv = (*c_attn_)(x);  // [B, T, 3 C/size]: this rank's heads, packed as in the whole model
  const bool keep = recompute_ != nn::Recompute::selective;
  Tensor y = core_ ? core_(qkv, local_heads_, keep) : scaled_dot_product_attention(qkv, local_heads_, true, 0.0f, 0, keep);
  return (*attn_proj_)(y);  // [B, T, C], or [B, T / size, C]
}

Tensor TensorParallelBlock::mlp(const Tensor& x) {
  // --fault exact-gelu (chapter 08, placed on the run's blocks): the exact GELU where the model uses tanh.
  const bool exact = faults::active("exact-gelu", this);
  return (*mlp_proj_)(gelu((*c_fc_)(x), exact ? GeluApproximate::none : GeluApproximate::tanh));
}

Tensor TensorParallelBlock::forward(const Tensor& x) {
  if (recompute_ != nn::Recompute::full) return layers(x);
  return autograd::checkpoint([this](const Tensor& input) { return layers(input); }, x);
}

Tensor TensorParallelBlock::layers(const Tensor& x) {
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

namespace {
bool ends_with(const std::string& name, const std::string& tail) {
  return name.size() >= tail.size() && name.compare(name.size() - tail.size(), tail.size(), tail) == 0;
}
}  // namespace

GptCut gpt_cut(const std::string& name) {
  if (name == "wte.weight" || name == "transformer.wte.weight" || ends_with(name, "mlp.c_fc.weight") ||
      ends_with(name, "mlp.c_fc.bias"))
    return GptCut::rows;
  if (ends_with(name, "attn.c_attn.weight") || ends_with(name, "attn.c_attn.bias")) return GptCut::qkv_rows;
  if (ends_with(name, "c_proj.weight")) return GptCut::columns;
  return GptCut::whole;
}

Tensor gpt_part(const std::string& name, const Tensor& whole, comm::Communicator& tp) {
  switch (gpt_cut(name)) {
    case GptCut::rows: return shard_of(whole, 0, tp, name.c_str());
    case GptCut::qkv_rows: return shard_of_qkv(whole, tp);
    case GptCut::columns: return shard_of(whole, 1, tp, name.c_str());
    case GptCut::whole: break;
  }
  return whole;
}

}  // namespace course::parallel
