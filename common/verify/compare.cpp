// Rounding bounds and differences.
#include "common/verify/compare.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace course::verify {

double gamma(std::int64_t n, double unit_roundoff) {
  const double nu = static_cast<double>(n) * unit_roundoff;
  return nu < 1.0 ? nu / (1.0 - nu) : std::numeric_limits<double>::infinity();
}

double summation_bound(double absolute_sum, std::int64_t roundings, Rounding rounding) {
  return gamma(roundings, rounding.unit_roundoff) * absolute_sum + static_cast<double>(roundings) * rounding.subnormal;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size())
    throw std::invalid_argument("max_abs_diff: " + std::to_string(a.size()) + " values against " +
                                std::to_string(b.size()));
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double d = std::fabs(static_cast<double>(a[i]) - static_cast<double>(b[i]));
    if (!(d <= worst)) worst = d;  // a NaN difference wins
  }
  return worst;
}

bool Drift::within(double short_run_tolerance) const {
  return difference <= short_run_tolerance || difference <= kDriftFactor * noise_floor;
}

EarlySteps check_early_steps(const std::vector<float>& run, const std::vector<float>& reference,
                             const std::vector<float>& reordered, double tolerance_per_step, std::size_t first) {
  if (first + run.size() > reference.size() || reordered.size() != reference.size())
    throw std::invalid_argument("check_early_steps: " + std::to_string(run.size()) + " steps from step " +
                                std::to_string(first) + " against a reference of " + std::to_string(reference.size()) +
                                " and a reordered run of " + std::to_string(reordered.size()));
  EarlySteps result;
  double floor = 0, worst_share = -1;
  for (std::size_t step = 0; step < first + run.size(); ++step) {
    floor = std::max(floor, std::fabs(static_cast<double>(reordered[step]) - reference[step]));
    const float magnitude = std::fabs(reference[step]);
    const double ulp = static_cast<double>(std::nextafter(magnitude, INFINITY) - magnitude);
    const double tolerance = std::max(tolerance_per_step * static_cast<double>(step + 1), kDriftFactor * ulp);
    if (kDriftFactor * floor > tolerance) break;  // the noise has grown: the whole run's Drift judges from here
    if (step < first) continue;
    const double difference = std::fabs(static_cast<double>(run[step - first]) - reference[step]);
    ++result.checked;
    if (difference / tolerance > worst_share) {
      worst_share = difference / tolerance;
      result.worst_step = step, result.difference = difference, result.tolerance = tolerance;
    }
  }
  return result;
}

}  // namespace course::verify
