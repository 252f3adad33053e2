// A lock-step check's record of the terms of each leaf's gradient (an autograd::LeafGradientObserver):
// while one is alive on this thread, backward also adds up, for every leaf, the absolute values of the
// contributions its gradient receives, in double, and counts them. That is what a lock-step check needs
// where a leaf receives several terms in one backward (a tied table: the embedding's and the output
// layer's) that a distributed run adds in another order, so that the bound of their sum covers the terms
// themselves and not only their total, which may cancel (lockstep.h). The loss scale reaches them too:
// it listens to GradScaler's unscaling (optim::UnscaleListener).
#pragma once
#include <unordered_map>
#include <vector>

#include "common/autograd/autograd.h"
#include "common/optim/grad_scaler.h"

namespace course::verify {

class ContributionMagnitudes final : public autograd::LeafGradientObserver, public optim::UnscaleListener {
 public:
  // This thread's innermost observer if it is one of these, or null.
  static ContributionMagnitudes* current();

  // The sum of |contribution| of each element of `leaf`'s gradient; null if it received none.
  const std::vector<double>* of(const Tensor& leaf) const;
  // The most contributions any leaf received.
  int most_contributions() const { return most_; }
  void contributed(const Tensor& leaf, const Tensor& contribution) override;  // the engine's
  // Terms computed elsewhere (another thread's backward): `count` contributions to each element of
  // `leaf`, the sums of their magnitudes.
  void add(const Tensor& leaf, const std::vector<double>& magnitude, int count);
  int count(const Tensor& leaf) const;  // how many contributions `leaf` received
  void unscaled(const std::vector<Tensor>& leaves, double factor) override;  // GradScaler's

 private:
  struct Sums {
    std::vector<double> magnitude;
    int count = 0;
  };
  std::unordered_map<const TensorImpl*, Sums> sums_;
  int most_ = 0;
};

}  // namespace course::verify
