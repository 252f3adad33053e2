// Layer implementations.
#include "common/nn/layers.h"

#include <cmath>

#include "common/ops/ops.h"
#include "common/tensor/random.h"

namespace course::nn {

Linear::Linear(std::int64_t in, std::int64_t out, Device device, std::uint64_t seed, bool with_bias) {
  MemoryCategoryScope scope(MemoryCategory::parameters);
  float bound = 1.0f / std::sqrt(static_cast<float>(in));
  // Distinct streams for weight and bias, both derived from the layer's seed.
  weight = register_parameter("weight", Tensor::rand_uniform({out, in}, random_bits(seed, 0), -bound, bound, device));
  if (with_bias)
    bias = register_parameter("bias", Tensor::rand_uniform({out}, random_bits(seed, 1), -bound, bound, device));
}

Tensor Linear::forward(const Tensor& x) { return linear(x, weight, bias); }
Tensor ReLU::forward(const Tensor& x) { return relu(x); }
Tensor GELU::forward(const Tensor& x) { return gelu(x, approximate_); }

void Sequential::add(std::shared_ptr<Module> module) {
  register_module(std::to_string(layers_.size()), module);
  layers_.push_back(std::move(module));
}

Tensor Sequential::forward(const Tensor& x) {
  Tensor h = x;
  for (auto& layer : layers_) h = (*layer)(h);  // through operator(), so forward hooks run
  return h;
}

Activation parse_activation(const std::string& name) {
  if (name == "relu") return Activation::relu;
  if (name == "gelu") return Activation::gelu;
  if (name == "gelu_tanh") return Activation::gelu_tanh;
  throw UsageError("unknown activation '" + name + "' (expected relu, gelu or gelu_tanh)");
}

std::shared_ptr<Sequential> make_mlp(std::int64_t in, std::int64_t hidden, int hidden_layers, std::int64_t out,
                                     Activation activation, Device device, std::uint64_t seed) {
  auto mlp = std::make_shared<Sequential>();
  std::int64_t width = in;
  for (int i = 0; i < hidden_layers; ++i) {
    mlp->add(std::make_shared<Linear>(width, hidden, device, random_bits(seed, 100 + i)));
    if (activation == Activation::relu) mlp->add(std::make_shared<ReLU>());
    else
      mlp->add(std::make_shared<GELU>(activation == Activation::gelu ? GeluApproximate::none : GeluApproximate::tanh));
    width = hidden;
  }
  mlp->add(std::make_shared<Linear>(width, out, device, random_bits(seed, 100 + hidden_layers)));
  return mlp;
}

}  // namespace course::nn
