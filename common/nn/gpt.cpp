// The GPT's modules.
#include "common/nn/gpt.h"

#include <cmath>
#include <sstream>

#include "common/autograd/checkpoint.h"
#include "common/core/errors.h"
#include "common/ops/ops.h"
#include "common/tensor/random.h"

namespace course::nn {
namespace {

constexpr float kInitStd = 0.02f;  // GPT-2's

// A Linear initialised as GPT-2: weight normal(0, std), bias zero.
std::shared_ptr<Linear> gpt_linear(std::int64_t in, std::int64_t out, float stddev, Device device, std::uint64_t seed) {
  auto layer = std::make_shared<Linear>(in, out, device, seed);
  layer->weight.copy_from(Tensor::randn({out, in}, random_bits(seed, 2), device, 0.0f, stddev));
  layer->bias.fill_(0.0f);
  return layer;
}

}  // namespace

void GPTConfig::check() const {
  const std::pair<const char*, std::int64_t> sizes[] = {{"n_layer", n_layer},
                                                        {"n_head", n_head},
                                                        {"n_embd", n_embd},
                                                        {"block_size", block_size},
                                                        {"vocab_size", vocab_size}};
  for (const auto& [name, value] : sizes)
    if (value < 1) throw UsageError(std::string(name) + " is " + std::to_string(value) + "; it must be at least 1");
  if (n_embd % n_head != 0)
    throw UsageError("n_head " + std::to_string(n_head) + " does not divide n_embd " + std::to_string(n_embd));
  if (!(dropout >= 0.0f && dropout < 1.0f))
    throw UsageError("dropout " + std::to_string(dropout) + " is outside [0, 1)");
}

std::string GPTConfig::to_json() const {
  std::ostringstream s;
  s << R"({"model":"gpt","n_layer":)" << n_layer << R"(,"n_head":)" << n_head << R"(,"n_embd":)" << n_embd
    << R"(,"block_size":)" << block_size << R"(,"vocab_size":)" << vocab_size << "}";
  return s.str();
}

LayerNorm::LayerNorm(std::int64_t dim, Device device) {
  MemoryCategoryScope scope(MemoryCategory::parameters);
  weight = register_parameter("weight", Tensor::ones({dim}, device));
  bias = register_parameter("bias", Tensor::zeros({dim}, device));
}

Tensor LayerNorm::forward(const Tensor& x) { return layer_norm(x, weight, bias); }

CausalSelfAttention::CausalSelfAttention(const GPTConfig& c, Device device, std::uint64_t seed)
    : n_head_(c.n_head), dropout_(c.dropout), seed_(seed) {
  MemoryCategoryScope scope(MemoryCategory::parameters);
  c_attn = register_module("c_attn", gpt_linear(c.n_embd, 3 * c.n_embd, kInitStd, device, random_bits(seed, 0)));
  c_proj = register_module(
      "c_proj", gpt_linear(c.n_embd, c.n_embd, kInitStd / std::sqrt(2.0f * static_cast<float>(c.n_layer)), device,
                           random_bits(seed, 1)));
}

Tensor CausalSelfAttention::forward(const Tensor& x) {
  // q, k and v side by side in one projection; the attention reads them in place (ops.h).
  Tensor qkv = (*c_attn)(x);  // [B, T, 3C]
  Tensor y = core ? core(qkv, n_head_, keep_probabilities)
                  : scaled_dot_product_attention(qkv, n_head_, true, dropout_, random_bits(seed_, ++calls_), keep_probabilities);
  return dropout((*c_proj)(y), dropout_, random_bits(seed_, ++calls_));
}

MLPBlock::MLPBlock(const GPTConfig& c, Device device, std::uint64_t seed) {
  MemoryCategoryScope scope(MemoryCategory::parameters);
  c_fc = register_module("c_fc", gpt_linear(c.n_embd, 4 * c.n_embd, kInitStd, device, random_bits(seed, 0)));
  c_proj = register_module(
      "c_proj", gpt_linear(4 * c.n_embd, c.n_embd, kInitStd / std::sqrt(2.0f * static_cast<float>(c.n_layer)), device,
                           random_bits(seed, 1)));
}

Tensor MLPBlock::forward(const Tensor& x) {
  const std::int64_t batch = x.dim(0), t = x.dim(1), c = x.dim(2);
  Tensor h = gelu((*c_fc)(reshape(x, {batch * t, c})), GeluApproximate::tanh);
  return reshape((*c_proj)(h), {batch, t, c});
}

Block::Block(const GPTConfig& c, Device device, std::uint64_t seed) {
  ln_1 = register_module("ln_1", std::make_shared<LayerNorm>(c.n_embd, device));
  attn = register_module("attn", std::make_shared<CausalSelfAttention>(c, device, random_bits(seed, 0)));
  ln_2 = register_module("ln_2", std::make_shared<LayerNorm>(c.n_embd, device));
  mlp = register_module("mlp", std::make_shared<MLPBlock>(c, device, random_bits(seed, 1)));
  set_recompute(c.recompute);
}

Tensor Block::forward(const Tensor& x) {
  if (!full_recompute_) return layers(x);
  // Full recomputation: only x is kept; backward runs the block again, its dropout from the same draws.
  const std::uint64_t calls = attn->calls();
  return autograd::checkpoint([this, calls](const Tensor& input) {
    attn->set_calls(calls);
    return layers(input);
  }, x);
}

Tensor Block::layers(const Tensor& x) {
  Tensor h = add(x, (*attn)((*ln_1)(x)));
  return add(h, (*mlp)((*ln_2)(h)));
}

void Block::set_recompute(Recompute recompute) {
  full_recompute_ = recompute == Recompute::full;
  // Full recomputation keeps them inside the block run again: one block's at a time.
  attn->keep_probabilities = recompute != Recompute::selective;
}

Recompute recompute_named(const std::string& name) {
  if (name == "none") return Recompute::none;
  if (name == "selective") return Recompute::selective;
  if (name == "full") return Recompute::full;
  throw UsageError("--recompute: '" + name + "' is not none, selective or full");
}

const char* recompute_name(Recompute recompute) {
  return recompute == Recompute::full ? "full" : recompute == Recompute::selective ? "selective" : "none";
}

// The token and position tables and the final norm are registered under "transformer." as in GPT-2.
class Transformer : public Module {
 public:
  Tensor forward(const Tensor& x) override { return x; }  // a container: GPT::forward drives it
  using Module::register_module;
  using Module::register_parameter;
};

GPT::GPT(const GPTConfig& config, Device device, std::uint64_t seed) : config_(config), device_(device) {
  config.check();
  MemoryCategoryScope scope(MemoryCategory::parameters);
  auto transformer = register_module("transformer", std::make_shared<Transformer>());
  wte = transformer->register_parameter(
      "wte.weight", Tensor::randn({config.vocab_size, config.n_embd}, random_bits(seed, 0), device, 0.0f, kInitStd));
  wpe = transformer->register_parameter(
      "wpe.weight", Tensor::randn({config.block_size, config.n_embd}, random_bits(seed, 1), device, 0.0f, kInitStd));
  auto layers = transformer->register_module("h", std::make_shared<Transformer>());
  for (std::int64_t i = 0; i < config.n_layer; ++i)
    blocks_.push_back(layers->register_module(
        std::to_string(i),
        std::make_shared<Block>(config, device, random_bits(seed, 10 + static_cast<std::uint64_t>(i)))));
  ln_f_ = transformer->register_module("ln_f", std::make_shared<LayerNorm>(config.n_embd, device));
}

void GPT::set_recompute(Recompute recompute) {
  for (auto& block : blocks_) block->set_recompute(recompute);
}

Tensor GPT::forward(const Tensor& ids) {
  if (ids.shape().size() != 2 || ids.dim(1) < 1 || ids.dim(1) > config_.block_size)
    throw std::invalid_argument("GPT: ids must be [batch, T] with 1 <= T <= block_size " +
                                std::to_string(config_.block_size) + ", got " + shape_string(ids.shape()));
  const std::int64_t batch = ids.dim(0), t = ids.dim(1), c = config_.n_embd;
  // [B, T, C] + [T, C]: every sequence gets the same position vectors; the positions made on the device.
  Tensor x = add(embedding(ids, wte), embedding(arange(t, device_), wpe));
  for (auto& block : blocks_) x = (*block)(x);
  x = (*ln_f_)(x);
  return matmul(reshape(x, {batch * t, c}), wte, false, true);  // the head is the token table, transposed
}

}  // namespace course::nn
