// Ops composed from primitives: their backward passes are the chain rule over the primitives'.
#include <stdexcept>

#include "common/ops/autocast.h"
#include "common/ops/ops.h"

namespace course {

Tensor mse_loss(const Tensor& prediction, const Tensor& target) {
  if (prediction.shape() != target.shape())
    throw std::invalid_argument("mse_loss: prediction " + shape_string(prediction.shape()) + " and target " +
                                shape_string(target.shape()) + " differ");
  Tensor diff = sub(autocast_input("mse_loss", prediction), autocast_input("mse_loss", target));
  return mean(mul(diff, diff));
}

Tensor cross_entropy(const Tensor& logits, const Tensor& targets, int ignore_index) {
  // The divisor is counted where the targets are: the host reads nothing until it reads the loss.
  const Tensor inverse = inverse_count(targets, ignore_index);
  return scale(sum(cross_entropy_per_row(logits, targets, ignore_index)), inverse);
}

}  // namespace course
