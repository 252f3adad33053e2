// What the lock-step check's files share (lockstep.cpp and its check kinds, lockstep_*.cpp): naming an
// element, a difference as a fraction of its bound, a formatted line, finiteness, one rounding's nudge.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "common/nn/module.h"

namespace course::verify::detail {

// Which parameter, and which element of it, flat index i falls in.
inline std::string locate(const nn::Module& model, std::size_t i) {
  for (const auto& [name, p] : model.named_parameters()) {
    const auto n = static_cast<std::size_t>(p.numel());
    if (i < n) return "'" + name + "'[" + std::to_string(i) + "]";
    i -= n;
  }
  return "?";
}

inline double ratio_of(double diff, double tolerance) {
  if (std::isnan(diff)) return std::numeric_limits<double>::infinity();
  return tolerance > 0 ? diff / tolerance : (diff == 0 ? 0.0 : std::numeric_limits<double>::infinity());
}

inline std::string text(const char* format, auto... values) {
  char buffer[400];
  std::snprintf(buffer, sizeof buffer, format, values...);
  return buffer;
}

// Whether every value in [begin, end) is finite.
template <class Iterator>
bool finite(Iterator begin, Iterator end) {
  return std::all_of(begin, end, [](float v) { return std::isfinite(v); });
}

// Every value moved by one unit in the last place, up or down as a hash of its index and the step
// says: a perturbation of every term of the computation by one rounding.
inline std::vector<float> nudged(std::vector<float> values, std::int64_t step) {
  for (std::size_t i = 0; i < values.size(); ++i) {
    std::uint64_t h = static_cast<std::uint64_t>(i) * 0x9e3779b97f4a7c15ull ^ static_cast<std::uint64_t>(step + 1) * 0xbf58476d1ce4e5b9ull;
    h = (h ^ (h >> 31)) * 0x94d049bb133111ebull;
    values[i] = std::nextafter(values[i], (h >> 63) != 0 ? INFINITY : -INFINITY);
  }
  return values;
}

}  // namespace course::verify::detail
