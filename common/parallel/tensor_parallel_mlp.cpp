// The MLP split in column-then-row pairs.
#include "common/parallel/tensor_parallel_mlp.h"

#include "common/autograd/autograd.h"
#include "common/core/errors.h"

namespace course::parallel {
TensorParallelMLP::TensorParallelMLP(const nn::Sequential& full, comm::Communicator& tp) : tp_(tp) {
  const auto& layers = full.layers();
  // The linear layers' positions, to pair them: column, row, column, row, ..., and whole if one is left.
  std::vector<std::size_t> linears;
  for (std::size_t i = 0; i < layers.size(); ++i)
    if (dynamic_cast<const nn::Linear*>(layers[i].get())) linears.push_back(i);
  const std::size_t paired = linears.size() - linears.size() % 2;
  for (std::size_t i = 0, k = 0; i < layers.size(); ++i) {
    const std::string name = std::to_string(i);
    const auto* linear = dynamic_cast<const nn::Linear*>(layers[i].get());
    std::shared_ptr<nn::Module> layer;
    if (!linear) {
      layer = layers[i];  // an activation: no parameters, the same object serves both models
    } else if (k < paired && k % 2 == 0) {
      layer = std::make_shared<ColumnParallelLinear>(*linear, tp);
      cut_[name + ".weight"] = 0;
      if (linear->bias.defined()) cut_[name + ".bias"] = 0;
    } else if (k < paired) {
      layer = std::make_shared<RowParallelLinear>(*linear, tp);
      cut_[name + ".weight"] = 1;
    } else {
      auto copy = std::make_shared<nn::Linear>(linear->weight.dim(1), linear->weight.dim(0), linear->weight.device(), 0,
                                               linear->bias.defined());
      autograd::NoGradGuard no_grad;
      copy->weight.copy_from(linear->weight);
      if (linear->bias.defined()) copy->bias.copy_from(linear->bias);
      layer = copy;
    }
    if (linear) ++k;
    layers_.push_back(register_module(name, layer));
  }
}

Tensor TensorParallelMLP::forward(const Tensor& x) {
  Tensor h = x;
  for (auto& layer : layers_) h = (*layer)(h);
  return h;
}

bool TensorParallelMLP::is_split(const std::string& name) const { return tp_.size() > 1 && cut_.count(name) > 0; }

Tensor TensorParallelMLP::part_of(const std::string& name, const Tensor& whole) const {
  const auto it = cut_.find(name);
  return it == cut_.end() || tp_.size() == 1 ? whole : shard_of(whole, it->second, tp_, name.c_str());
}

}  // namespace course::parallel
