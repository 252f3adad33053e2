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

double short_run_tolerance(double lr, long steps) { return 1e-3 * lr * static_cast<double>(steps); }

std::vector<double> noise_floor_tolerances(const std::vector<double>& floors, const std::vector<double>& largest,
                                           const std::vector<std::int64_t>& elements, double factor,
                                           std::int64_t stable_elements) {
  if (floors.size() != largest.size() || floors.size() != elements.size())
    throw std::invalid_argument("noise_floor_tolerances: " + std::to_string(floors.size()) + " floors for " +
                                std::to_string(largest.size()) + " tensors of " + std::to_string(elements.size()) +
                                " sizes");
  std::vector<double> relative;
  for (std::size_t t = 0; t < floors.size(); ++t)
    if (largest[t] > 0 && std::isfinite(floors[t])) relative.push_back(floors[t] / largest[t]);
  double median = 0, most = 0;
  if (!relative.empty()) {
    most = *std::max_element(relative.begin(), relative.end());
    std::nth_element(relative.begin(), relative.begin() + static_cast<long>(relative.size() / 2), relative.end());
    median = relative[relative.size() / 2];
  }
  std::vector<double> tolerances;
  for (std::size_t t = 0; t < floors.size(); ++t) {
    const double pooled = elements[t] < stable_elements ? most : median;
    tolerances.push_back(factor * std::max({floors[t], pooled * largest[t], kUnitRoundoff * largest[t]}));
  }
  return tolerances;
}

double FloorHistory::remember(std::size_t index, double floor) {
  if (floors_.size() <= index) floors_.resize(index + 1);
  auto& history = floors_[index];
  history.push_back(floor);
  if (history.size() > static_cast<std::size_t>(kFloorHistory)) history.erase(history.begin());
  double most = 0;
  for (double f : history) most = std::isnan(f) || f > most ? f : most;
  return most;
}

double RoundingBias::sum() const {
  const double sum = std::max(std::fabs(plain_), std::fabs(toward_));
  return std::isnan(plain_) || std::isnan(toward_) ? std::numeric_limits<double>::infinity() : sum;
}

double RoundingBias::threshold() const {
  return std::sqrt(2.0 * std::log(2.0 / kRoundingBiasFalseAlarm) * static_cast<double>(elements_)) + allowed_;
}

double RoundingBias::ratio() const {
  const double s = sum(), t = threshold();
  return t > 0 ? s / t : (s == 0 ? 0.0 : std::numeric_limits<double>::infinity());
}

const char* RoundingBias::direction() const {
  if (std::fabs(toward_) >= std::fabs(plain_)) return toward_ < 0 ? "toward zero" : "away from zero";
  return plain_ < 0 ? "downward" : "upward";
}

double norm_bound(double norm, std::int64_t partial_sums) {
  return (0.5 * gamma(2 * std::max<std::int64_t>(1, partial_sums)) + kUnitRoundoff) * norm;
}

}  // namespace course::verify
