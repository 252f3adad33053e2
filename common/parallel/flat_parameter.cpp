// Units, offsets and the segments of each rank's part.
#include "common/parallel/flat_parameter.h"

#include <algorithm>
#include <stdexcept>

namespace course::parallel {

namespace {
std::vector<std::int64_t> numels_of(const std::vector<Tensor>& params) {
  std::vector<std::int64_t> n;
  for (const auto& p : params) n.push_back(p.numel());
  return n;
}
}  // namespace

FlatLayout::FlatLayout(const std::vector<Tensor>& params, int shards, std::int64_t unit_cap_elements)
    : shards_(shards), numels_(numels_of(params)), offsets_(params.size()), unit_of_(params.size()) {
  if (unit_cap_elements < 1) throw std::invalid_argument("FlatLayout: the unit cap must be positive");
  std::vector<std::vector<std::size_t>> units(1);
  std::int64_t size = 0;
  for (std::size_t k = params.size(); k-- > 0;) {
    if (!units.back().empty() && size + numels_[k] > unit_cap_elements) units.emplace_back(), size = 0;
    units.back().push_back(k);
    size += numels_[k];
  }
  build(units);
}

FlatLayout::FlatLayout(const std::vector<Tensor>& params, int shards, const std::vector<std::vector<std::size_t>>& units)
    : shards_(shards), numels_(numels_of(params)), offsets_(params.size()), unit_of_(params.size()) {
  std::vector<int> seen(params.size(), 0);
  for (const auto& unit : units)
    for (std::size_t p : unit) {
      if (p >= params.size()) throw std::invalid_argument("FlatLayout: a unit names parameter " + std::to_string(p));
      ++seen[p];
    }
  for (std::size_t p = 0; p < params.size(); ++p)
    if (seen[p] != 1)
      throw std::invalid_argument("FlatLayout: parameter " + std::to_string(p) + " is in " + std::to_string(seen[p]) +
                                  " units, not one");
  build(units);
}

void FlatLayout::build(const std::vector<std::vector<std::size_t>>& units) {
  if (shards_ < 1) throw std::invalid_argument("FlatLayout: shards must be at least 1, got " + std::to_string(shards_));
  for (const auto& members : units) {
    if (members.empty()) continue;
    FlatUnit unit;
    unit.params = members;
    for (std::size_t p : members) unit.numel += numels_[p];
    unit.padded = (unit.numel + shards_ - 1) / shards_ * shards_;
    unit.part = unit.padded / shards_;
    unit.offset = padded_;
    unit.shard_offset = padded_ / shards_;
    std::int64_t at = unit.offset;
    for (std::size_t p : unit.params) {
      offsets_[p] = at;
      unit_of_[p] = units_.size();
      at += numels_[p];
    }
    padded_ += unit.padded;
    numel_ += unit.numel;
    units_.push_back(unit);
  }
}

std::vector<FlatSegment> FlatLayout::segments(std::size_t u, int rank) const {
  const FlatUnit& unit = units_.at(u);
  const std::int64_t begin = unit.offset + rank * unit.part, end = begin + unit.part;
  std::vector<FlatSegment> out;
  for (std::size_t p : unit.params) {
    const std::int64_t lo = std::max(begin, offsets_[p]), hi = std::min(end, offsets_[p] + numels_[p]);
    if (lo < hi) out.push_back({p, lo - offsets_[p], lo - begin, hi - lo});
  }
  return out;
}

}  // namespace course::parallel
