// Layers: Linear, activations, Sequential, and the MLP built from them.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/nn/module.h"
#include "common/ops/ops.h"

namespace course::nn {

// y = x W^T + b with W of shape [out, in], initialised like PyTorch: U(-1/sqrt(in), 1/sqrt(in)).
class Linear : public Module {
 public:
  Linear(std::int64_t in_features, std::int64_t out_features, Device device, std::uint64_t seed, bool bias = true);
  Tensor forward(const Tensor& x) override;
  Tensor weight, bias;
};

class ReLU : public Module {
 public:
  Tensor forward(const Tensor& x) override;
};

// nn.GELU(approximate="none" | "tanh"): exact by default, as in PyTorch.
class GELU : public Module {
 public:
  explicit GELU(GeluApproximate approximate = GeluApproximate::none) : approximate_(approximate) {}
  Tensor forward(const Tensor& x) override;
  GeluApproximate approximate() const { return approximate_; }

 private:
  GeluApproximate approximate_;
};

class Sequential : public Module {
 public:
  void add(std::shared_ptr<Module> module);  // named by its position: "0", "1", ...
  Tensor forward(const Tensor& x) override;
  const std::vector<std::shared_ptr<Module>>& layers() const { return layers_; }

 private:
  std::vector<std::shared_ptr<Module>> layers_;
};

enum class Activation { relu, gelu, gelu_tanh };  // "relu", "gelu" (exact), "gelu_tanh"
Activation parse_activation(const std::string& name);  // throws UsageError for an unknown name

// in -> hidden -> ... -> hidden -> out, with `hidden_layers` hidden layers and an activation between.
std::shared_ptr<Sequential> make_mlp(std::int64_t in_features, std::int64_t hidden, int hidden_layers,
                                     std::int64_t out_features, Activation activation, Device device,
                                     std::uint64_t seed);

}  // namespace course::nn
