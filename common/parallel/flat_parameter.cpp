// Units, offsets and the segments of each rank's part.
#include "common/parallel/flat_parameter.h"

#include <algorithm>
#include <stdexcept>

namespace course::parallel {

FlatLayout::FlatLayout(const std::vector<Tensor>& params, int shards, std::int64_t unit_cap_elements)
    : shards_(shards), numels_(params.size()), offsets_(params.size()), unit_of_(params.size()) {
  if (shards < 1) throw std::invalid_argument("FlatLayout: shards must be at least 1, got " + std::to_string(shards));
  if (unit_cap_elements < 1) throw std::invalid_argument("FlatLayout: the unit cap must be positive");
  for (std::size_t i = 0; i < params.size(); ++i) numels_[i] = params[i].numel();
  FlatUnit unit;
  auto close = [&] {
    if (unit.params.empty()) return;
    unit.padded = (unit.numel + shards - 1) / shards * shards;
    unit.part = unit.padded / shards;
    unit.offset = padded_;
    unit.shard_offset = padded_ / shards;
    std::int64_t at = unit.offset;
    for (std::size_t p : unit.params) {
      offsets_[p] = at;
      unit_of_[p] = units_.size();
      at += numels_[p];
    }
    padded_ += unit.padded;
    numel_ += unit.numel;
    units_.push_back(unit);
    unit = FlatUnit{};
  };
  for (std::size_t k = params.size(); k-- > 0;) {
    if (!unit.params.empty() && unit.numel + numels_[k] > unit_cap_elements) close();
    unit.params.push_back(k);
    unit.numel += numels_[k];
  }
  close();
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
