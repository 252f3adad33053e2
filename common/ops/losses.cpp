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
  std::size_t counted = 0;
  for (float t : targets.to_host()) counted += t != static_cast<float>(ignore_index);
  if (counted == 0) throw std::invalid_argument("cross_entropy: every target is ignored");
  return scale(sum(cross_entropy_per_row(logits, targets, ignore_index)), 1.0f / static_cast<float>(counted));
}

}  // namespace course
