// Parameters laid end to end in flat buffers, one per unit (a group of consecutive parameters), each
// unit padded to a multiple of the group size so that it splits into equal shards whatever the
// parameter count and world size: 1 to 8 ranks, 3, 5 and 7 included, nothing refused for being
// indivisible. This is FSDP's FlatParameter (Zhao et al., "PyTorch FSDP", VLDB 2023) and ZeRO's
// partitioning (Rajbhandari et al., SC 2020): rank r owns part r of every unit.
//
//   unit 0: | p3 p2 ......... pad | unit 1: | p1 p0 ..... pad |
//           | rank 0 | rank 1 |           | rank 0 | rank 1 |
#pragma once
#include <cstdint>
#include <vector>

#include "common/tensor/tensor.h"

namespace course::parallel {

// A piece of one parameter inside one rank's part of a unit.
struct FlatSegment {
  std::size_t param;          // index into the parameter list
  std::int64_t param_offset;  // first element within the parameter
  std::int64_t part_offset;   // first element within the rank's part of the unit
  std::int64_t length;
};

struct FlatUnit {
  std::vector<std::size_t> params;  // indices, in the order they are laid out
  std::int64_t offset = 0;          // the unit's first element in the flat buffer
  std::int64_t numel = 0;           // its parameters' elements
  std::int64_t padded = 0;          // numel rounded up to a multiple of the shard count
  std::int64_t part = 0;            // padded / shards: one rank's part
  std::int64_t shard_offset = 0;    // where this unit's part starts in a rank's shard
};

class FlatLayout {
 public:
  // Units of at most `unit_cap_elements` (a parameter larger than the cap is a unit of its own), built
  // in reverse registration order, the order backward produces gradients (as DDP's buckets).
  FlatLayout(const std::vector<Tensor>& params, int shards, std::int64_t unit_cap_elements);
  // Units given explicitly, as lists of parameter indices (ZeRO-3: one unit per wrapped module); every
  // parameter must appear in exactly one.
  FlatLayout(const std::vector<Tensor>& params, int shards, const std::vector<std::vector<std::size_t>>& units);

  int shards() const { return shards_; }
  const std::vector<FlatUnit>& units() const { return units_; }
  std::int64_t numel() const { return numel_; }    // every parameter's elements
  std::int64_t padded() const { return padded_; }  // the flat buffer's length
  std::int64_t shard() const { return padded_ / shards_; }  // one rank's share of every unit together
  std::int64_t offset_of(std::size_t param) const { return offsets_[param]; }
  std::int64_t numel_of(std::size_t param) const { return numels_[param]; }
  std::size_t unit_of(std::size_t param) const { return unit_of_[param]; }
  // The pieces of parameters in rank `rank`'s part of `unit`.
  std::vector<FlatSegment> segments(std::size_t unit, int rank) const;

 private:
  void build(const std::vector<std::vector<std::size_t>>& units);
  int shards_;
  std::vector<std::int64_t> numels_, offsets_;
  std::vector<std::size_t> unit_of_;
  std::vector<FlatUnit> units_;
  std::int64_t numel_ = 0, padded_ = 0;
};

}  // namespace course::parallel
