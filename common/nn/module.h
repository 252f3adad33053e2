// Modules: parameters registered by name in a stable order (checkpoints and DDP rely on it).
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/tensor/tensor.h"

namespace course::nn {

using NamedTensor = std::pair<std::string, Tensor>;

class Module;
// PyTorch's forward hooks: a pre-hook runs before forward (ZeRO-3 gathers the module's parameters
// there); a hook runs after it and may replace the output (ZeRO-3 frees the parameters again and marks
// the output so that backward gathers them back).
using ForwardPreHook = std::function<void(Module& module)>;
using ForwardHook = std::function<Tensor(Module& module, const Tensor& output)>;

class Module {
 public:
  virtual ~Module() = default;
  virtual Tensor forward(const Tensor& x) = 0;
  Tensor operator()(const Tensor& x);  // the pre-hooks, forward, then the hooks
  void register_forward_pre_hook(ForwardPreHook hook) { pre_hooks_.push_back(std::move(hook)); }
  void register_forward_hook(ForwardHook hook) { hooks_.push_back(std::move(hook)); }
  // Every module below this one (this one first, as ""), with its qualified name, depth first in
  // registration order (PyTorch's named_modules).
  std::vector<std::pair<std::string, Module*>> named_modules();

  // Own parameters first, then each child's as "child.name", in registration order.
  std::vector<NamedTensor> named_parameters() const;
  std::vector<Tensor> parameters() const;
  std::int64_t parameter_count() const;
  // Every parameter's values copied to the host and laid end to end, in registration order
  // (PyTorch's parameters_to_vector): for comparing two models.
  std::vector<float> parameters_to_host() const;
  // The same for the gradients, zeros where a parameter has none.
  std::vector<float> gradients_to_host() const;
  // Overwrites every parameter with `values`, laid out as parameters_to_host() lays them; throws
  // std::invalid_argument when the count differs.
  void load_parameters_from_host(const std::vector<float>& values);
  // PyTorch's module.to(dtype) (model.bfloat16(), model.half()): every parameter converted in place to
  // `dtype`, rounded to nearest even, its gradient dropped. The tensors stay the same objects, so the
  // modules holding them compute in the new type.
  void to(DType dtype);
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
  std::vector<ForwardPreHook> pre_hooks_;
  std::vector<ForwardHook> hooks_;
};

// PyTorch's nn.ModuleDict: a module that only names the ones below it ("transformer", "h", "attn"), so
// that a model built in parts (a pipeline stage, a tensor-parallel block) keeps GPT-2's nested names.
// It computes nothing: its forward throws, as ModuleDict's does.
class ModuleDict : public Module {
 public:
  Tensor forward(const Tensor& x) override;
  using Module::register_module;
  using Module::register_parameter;
};

}  // namespace course::nn
