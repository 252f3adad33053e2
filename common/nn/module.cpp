// Module parameter registry.
#include "common/nn/module.h"

#include <algorithm>
#include <stdexcept>

#include "common/core/memory.h"

namespace course::nn {

Tensor ModuleDict::forward(const Tensor&) {
  throw std::logic_error("ModuleDict has no forward: call the modules it names");
}

Tensor Module::operator()(const Tensor& x) {
  for (auto& hook : pre_hooks_) hook(*this);
  Tensor out = forward(x);
  for (auto& hook : hooks_) out = hook(*this, out);
  return out;
}

std::vector<std::pair<std::string, Module*>> Module::named_modules() {
  std::vector<std::pair<std::string, Module*>> out{{"", this}};
  for (const auto& [prefix, child] : children_)
    for (auto& [name, module] : child->named_modules())
      out.emplace_back(name.empty() ? prefix : prefix + "." + name, module);
  return out;
}

std::vector<NamedTensor> Module::named_parameters() const {
  std::vector<NamedTensor> out = parameters_;
  for (const auto& [prefix, child] : children_)
    for (auto& [name, tensor] : child->named_parameters()) out.emplace_back(prefix + "." + name, tensor);
  return out;
}

std::vector<Tensor> Module::parameters() const {
  std::vector<Tensor> out;
  for (auto& [name, tensor] : named_parameters()) out.push_back(tensor);
  return out;
}

std::int64_t Module::parameter_count() const {
  std::int64_t n = 0;
  for (auto& [name, tensor] : named_parameters()) n += tensor.numel();
  return n;
}

// Each tensor's values straight into one vector sized once: at millions of parameters a verified run
// calls these at every step, and growing the vector (or a temporary per tensor) copies it again.
std::vector<float> Module::parameters_to_host() const {
  std::vector<float> out(static_cast<std::size_t>(parameter_count()));
  std::size_t at = 0;
  for (auto& [name, tensor] : named_parameters()) {
    tensor.to_host(out.data() + at);
    at += static_cast<std::size_t>(tensor.numel());
  }
  return out;
}

std::vector<float> Module::gradients_to_host() const {
  std::vector<float> out(static_cast<std::size_t>(parameter_count()));  // zeros where a gradient is undefined
  std::size_t at = 0;
  for (auto& [name, tensor] : named_parameters()) {
    if (Tensor g = tensor.grad(); g.defined()) g.to_host(out.data() + at);
    at += static_cast<std::size_t>(tensor.numel());
  }
  return out;
}

void Module::load_parameters_from_host(const std::vector<float>& values) {
  if (static_cast<std::int64_t>(values.size()) != parameter_count())
    throw std::invalid_argument("load_parameters_from_host: " + std::to_string(values.size()) + " values for " +
                                std::to_string(parameter_count()) + " parameters");
  std::size_t at = 0;
  for (auto& [name, tensor] : named_parameters()) {
    const auto n = static_cast<std::size_t>(tensor.numel());
    if (tensor.device() == Device::cpu && tensor.dtype() == DType::float32) {  // straight in: no temporary
      std::copy(values.begin() + static_cast<long>(at), values.begin() + static_cast<long>(at + n), tensor.data());
    } else {
      Tensor target = tensor;
      target.copy_from(Tensor::from_host(std::vector<float>(values.begin() + static_cast<long>(at),
                                                            values.begin() + static_cast<long>(at + n)),
                                         tensor.shape(), tensor.device()));
    }
    at += n;
  }
}

void Module::to(DType dtype) {
  for (auto& [name, tensor] : named_parameters()) {
    if (tensor.dtype() == dtype) continue;
    Tensor converted;
    {
      MemoryCategoryScope scope(MemoryCategory::parameters);
      converted = tensor.to(dtype);
    }
    TensorImpl& impl = *tensor.impl();
    impl.storage = converted.impl()->storage;
    impl.offset = converted.impl()->offset;
    impl.dtype = dtype;
    impl.grad = nullptr;
  }
}

void Module::zero_grad() {
  for (auto& [name, tensor] : named_parameters()) tensor.zero_grad();
}

Tensor Module::register_parameter(std::string name, Tensor tensor) {
  tensor.set_requires_grad(true);
  parameters_.emplace_back(std::move(name), tensor);
  return tensor;
}

}  // namespace course::nn
