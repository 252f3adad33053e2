// The terms of each leaf's gradient, recorded for a lock-step check.
#include "common/verify/contribution_magnitudes.h"

#include <algorithm>
#include <cmath>

namespace course::verify {

ContributionMagnitudes* ContributionMagnitudes::current() {
  return dynamic_cast<ContributionMagnitudes*>(autograd::LeafGradientObserver::current());
}

const std::vector<double>* ContributionMagnitudes::of(const Tensor& leaf) const {
  const auto found = sums_.find(leaf.impl());
  return found == sums_.end() ? nullptr : &found->second.magnitude;
}

void ContributionMagnitudes::contributed(const Tensor& leaf, const Tensor& contribution) {
  Sums& sums = sums_[leaf.impl()];
  const std::vector<float> values = contribution.to_host();
  sums.magnitude.resize(values.size(), 0.0);
  for (std::size_t i = 0; i < values.size(); ++i) sums.magnitude[i] += std::fabs(static_cast<double>(values[i]));
  most_ = std::max(most_, ++sums.count);
}

void ContributionMagnitudes::add(const Tensor& leaf, const std::vector<double>& magnitude, int count) {
  Sums& sums = sums_[leaf.impl()];
  sums.magnitude.resize(magnitude.size(), 0.0);
  for (std::size_t i = 0; i < magnitude.size(); ++i) sums.magnitude[i] += magnitude[i];
  sums.count += count;
  most_ = std::max(most_, sums.count);
}

int ContributionMagnitudes::count(const Tensor& leaf) const {
  const auto found = sums_.find(leaf.impl());
  return found == sums_.end() ? 0 : found->second.count;
}

void ContributionMagnitudes::unscaled(const std::vector<Tensor>& leaves, double factor) {
  for (const Tensor& leaf : leaves) {
    const auto found = sums_.find(leaf.impl());
    if (found != sums_.end())
      for (double& m : found->second.magnitude) m *= factor;
  }
}

}  // namespace course::verify
