// The forward under autocast and the scaled backward, written once.
#include "common/optim/mixed_precision.h"

#include "common/ops/autocast.h"

namespace course::optim {

Tensor MixedPrecision::forward(const std::function<Tensor()>& forward) const {
  Autocast autocast(precision_);  // float32: off
  return forward();
}

void MixedPrecision::backward(const Tensor& loss) const { scaler_->scale(loss).backward(); }

Tensor MixedPrecision::forward_backward(const std::function<Tensor()>& forward) const {
  Tensor loss = this->forward(forward);
  backward(loss);
  return loss;
}

}  // namespace course::optim
