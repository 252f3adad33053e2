// Modules: parameters registered by name in a stable order (checkpoints and DDP rely on it).
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/tensor/tensor.h"

namespace course::nn {

using NamedTensor = std::pair<std::string, Tensor>;

class Module {
 public:
  virtual ~Module() = default;
  virtual Tensor forward(const Tensor& x) = 0;
  Tensor operator()(const Tensor& x) { return forward(x); }

  // Own parameters first, then each child's as "child.name", in registration order.
  std::vector<NamedTensor> named_parameters() const;
  std::vector<Tensor> parameters() const;
  std::int64_t parameter_count() const;
  // Every parameter's values copied to the host and laid end to end, in registration order
  // (PyTorch's parameters_to_vector): for comparing two models.
  std::vector<float> parameters_to_host() const;
  void zero_grad();

 protected:
  // Marks the tensor as a trainable leaf. Create it inside MemoryCategoryScope(parameters).
  Tensor register_parameter(std::string name, Tensor tensor);
  template <class M>
  std::shared_ptr<M> register_module(std::string name, std::shared_ptr<M> module) {
    children_.emplace_back(std::move(name), module);
    return module;
  }

 private:
  std::vector<NamedTensor> parameters_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
};

}  // namespace course::nn
