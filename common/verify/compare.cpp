// Rounding bounds and differences.
#include "common/verify/compare.h"

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

}  // namespace course::verify
