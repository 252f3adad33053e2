// A decoder-only transformer, GPT-2's architecture (Radford et al., 2019) as nanoGPT writes it:
// token and position embeddings, n_layer pre-norm blocks of causal multi-head self-attention and an
// MLP, a final layer norm, and an output head tied to the token embedding. Parameters carry GPT-2's
// names (transformer.wte.weight, transformer.h.0.attn.c_attn.weight, ...), in PyTorch's nn.Linear
// layout ([out, in]); the tied head has no parameter of its own.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/nn/layers.h"

namespace course::nn {

// Activation recomputation (Korthikanti et al., "Reducing Activation Recomputation in Large
// Transformer Models", 2022): none keeps every activation backward needs; selective recomputes only
// attention's [B, H, T, T] probabilities in backward (the largest part, the cheapest to redo); full
// keeps only each block's input and runs the whole block again in backward (Chen et al., 2016).
// Gradients are bit-identical in all three: the same ops on the same values.
enum class Recompute { none, selective, full };
// "none", "selective" or "full"; throws UsageError naming --recompute otherwise.
Recompute recompute_named(const std::string& name);
const char* recompute_name(Recompute recompute);  // its inverse: "none", "selective" or "full"

struct GPTConfig {
  std::int64_t n_layer = 2, n_head = 2, n_embd = 64, block_size = 32, vocab_size = 16;
  float dropout = 0.0f;  // off for verification: dropout makes each rank's step different by design
  Recompute recompute = Recompute::none;  // what backward keeps (not the model: not in to_json)
  // Throws UsageError naming the first size that is not positive, or heads that do not divide n_embd.
  void check() const;
  std::string to_json() const;  // for checkpoints: the configuration a checkpoint must match
};

class LayerNorm : public Module {
 public:
  LayerNorm(std::int64_t dim, Device device);
  Tensor forward(const Tensor& x) override;
  Tensor weight, bias;
};

// Attention's core on the packed projection qkv [B, T, 3C] with n_head heads, keeping its probabilities
// or not (selective recomputation): scaled_dot_product_attention unless a model sets another, as a
// context-parallel model sets ContextParallel::attention (its rank's tokens of the whole sequence's).
using AttentionCore = std::function<Tensor(const Tensor& qkv, std::int64_t n_head, bool keep_probabilities)>;

// Causal multi-head self-attention on [B, T, C]: one projection to queries, keys and values
// (c_attn), softmax(q k^T / sqrt(head size)) with the causal mask, and the output projection (c_proj).
class CausalSelfAttention : public Module {
 public:
  CausalSelfAttention(const GPTConfig& config, Device device, std::uint64_t seed);
  Tensor forward(const Tensor& x) override;
  std::shared_ptr<Linear> c_attn, c_proj;
  bool keep_probabilities = true;  // false: selective recomputation
  AttentionCore core;              // empty: scaled_dot_product_attention (with dropout)
  // Dropout's draws so far: a block run again in backward starts from the count its forward started from.
  std::uint64_t calls() const { return calls_; }
  void set_calls(std::uint64_t calls) { calls_ = calls; }

 private:
  std::int64_t n_head_;
  float dropout_;
  std::uint64_t seed_, calls_ = 0;
};

// Linear to 4 C, GELU (tanh, as GPT-2), linear back to C.
class MLPBlock : public Module {
 public:
  MLPBlock(const GPTConfig& config, Device device, std::uint64_t seed);
  Tensor forward(const Tensor& x) override;
  std::shared_ptr<Linear> c_fc, c_proj;
};

// x + attn(ln_1(x)), then + mlp(ln_2(x)): the pre-norm residual block.
class Block : public Module {
 public:
  Block(const GPTConfig& config, Device device, std::uint64_t seed);
  Tensor forward(const Tensor& x) override;
  void set_recompute(Recompute recompute);
  std::shared_ptr<LayerNorm> ln_1, ln_2;
  std::shared_ptr<CausalSelfAttention> attn;
  std::shared_ptr<MLPBlock> mlp;

 private:
  Tensor layers(const Tensor& x);
  bool full_recompute_ = false;
};

class GPT : public Module {
 public:
  // GPT-2's initialisation: weights normal(0, 0.02), the residual projections (c_proj) scaled by
  // 1/sqrt(2 n_layer), biases zero, layer norms 1 and 0.
  GPT(const GPTConfig& config, Device device, std::uint64_t seed);
  // ids: [B, T] token indices as floats, T <= block_size. Returns the logits, [B * T, vocab_size].
  Tensor forward(const Tensor& ids) override;
  const GPTConfig& config() const { return config_; }
  // --recompute: what every block keeps for backward (none by default).
  void set_recompute(Recompute recompute);
  const std::vector<std::shared_ptr<Block>>& blocks() const { return blocks_; }
  const LayerNorm& ln_f() const { return *ln_f_; }
  Tensor wte, wpe;

 private:
  GPTConfig config_;
  Device device_;
  std::vector<std::shared_ptr<Block>> blocks_;
  std::shared_ptr<LayerNorm> ln_f_;
};

}  // namespace course::nn
