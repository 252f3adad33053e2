// Mixed precision as one policy (Micikevicius et al., "Mixed Precision Training", ICLR 2018): the forward
// under autocast in the run's type (off in float32), backward from the loss times float16's loss scale.
// Chapter 04's loop writes these steps out; everywhere else they are this object's: a Recipe holds one,
// chapter 07's ZeroOptimizer holds one over its own scaler, chapter 08's pipeline takes one.
#pragma once
#include <functional>

#include "common/core/dtype.h"
#include "common/tensor/tensor.h"
#include "common/optim/grad_scaler.h"

namespace course::optim {

class MixedPrecision {
 public:
  // `scaler` must outlive the policy (its owner holds both).
  MixedPrecision(DType precision, const GradScaler& scaler) : precision_(precision), scaler_(&scaler) {}
  DType dtype() const { return precision_; }
  // `forward` under autocast (off in float32); returns its loss.
  Tensor forward(const std::function<Tensor()>& forward) const;
  // Backward from `loss` times the loss scale (float16), or from `loss` itself.
  void backward(const Tensor& loss) const;
  // Both: returns the loss.
  Tensor forward_backward(const std::function<Tensor()>& forward) const;
  // What backward starts from, as a factor: float16's current scale, 1 otherwise.
  float loss_scale() const { return scaler_->get_scale(); }

 private:
  DType precision_;
  const GradScaler* scaler_;
};

}  // namespace course::optim
