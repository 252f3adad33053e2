// Chapter 07's shards, the exercise of the chapter (07.1): which pieces of the parameters a rank owns,
// and so updates with its part of Adam's state. The chapter hands it to the ZeroOptimizer
// (ZeroOptions::owned_segments); the library keeps its own (parallel::FlatLayout::segments, for every other
// user), which the graded tests hold this one against (tests/shards_exercise_test.cpp).
#pragma once
#include <cstdint>
#include <vector>

#include "common/parallel/flat_parameter.h"  // FlatSegment

namespace course::chapter07 {

// A unit's parameters lie end to end (`numels`, in their layout order), padded to `part` x ranks; rank
// `rank` owns elements [rank x part, (rank + 1) x part) of it. Returns the pieces of parameters in that
// range, in order: each piece's parameter (its position in `numels`), its first element in the parameter,
// its first element in the rank's part, and its length. The padding belongs to no parameter.
std::vector<parallel::FlatSegment> owned_segments(const std::vector<std::int64_t>& numels, std::int64_t part, int rank);

}  // namespace course::chapter07
