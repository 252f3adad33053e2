// The update the lock-step check expects, from the papers' formulas in plain scalar loops: no kernel and
// no optimizer class, so a slip in either shows as a difference from the run's update. The lock-step check
// otherwise repeats the update with the run's own optimizer class, which shares the run's mistakes.
//   SGD with momentum and weight decay, as torch.optim.SGD (the buffer starts at zero);
//   Adam (Kingma & Ba, "Adam: A Method for Stochastic Optimization", 2015, Algorithm 1, with PyTorch's
//   placement of eps and L2 weight decay added to the gradient);
//   AdamW (Loshchilov & Hutter, "Decoupled Weight Decay Regularization", 2019, Algorithm 2: the decay
//   applied to the parameter, scaled by the rate as PyTorch's AdamW scales it).
// In explicitly rounded operations (kernels/rounded.h), associated as the kernels associate them, so a
// correct optimizer gives the same bits on every device.
#pragma once
#include <cstddef>
#include <vector>

#include "common/nn/module.h"
#include "common/optim/optimizer.h"

namespace course::verify {

class ReferenceOptimizer {
 public:
  // `optimizer` steps `model`'s parameters: its kind, hyperparameters and state (zeros before its first
  // step, or what a resumed run loaded) are read now, once; from then on this keeps its own.
  ReferenceOptimizer(const optim::Optimizer& optimizer, const nn::Module& model);
  // One update of `params` (flat, in the model's order) from `grads` at rate `lr`, in place.
  void step(std::vector<float>& params, const std::vector<float>& grads, float lr);

 private:
  optim::Settings settings_;
  std::vector<float> weight_decay_;  // per element, in the model's order
  std::vector<float> first_, second_;  // momentum, or Adam's two moments, per element
  long steps_ = 0;
};

}  // namespace course::verify
