// Chapter 07's shards (its exercise 07.1).
#include "07_zero/shards.h"

#include <algorithm>

#include "common/core/exercise.h"  // exercise::not_done: the participant's copy stops at an unwritten one

namespace course::chapter07 {

// EXERCISE 07.1: the pieces of the parameters a rank owns.
// Walk the parameters in order, keeping where each starts in the unit (the sum of the numels before it).
// Rank `rank`'s part is [rank * part, (rank + 1) * part). Where a parameter's range and the part overlap,
// that overlap is a piece: {parameter, its first element in the parameter, its first element in the
// part, its length}. A parameter may be cut between two ranks, a rank may own pieces of several
// parameters, and the last rank's part may end in padding (no piece there). Hint: an empty overlap is no
// piece. Graded by ex07.1 (and 07's --verify at stages 1-3).
std::vector<parallel::FlatSegment> owned_segments(const std::vector<std::int64_t>& numels, std::int64_t part, int rank) {
  // BEGIN EXERCISE 07.1
  std::vector<parallel::FlatSegment> pieces;
  const std::int64_t begin = rank * part, end = begin + part;  // the part, in the unit's elements
  std::int64_t start = 0;                                      // where this parameter starts in the unit
  for (std::size_t k = 0; k < numels.size(); ++k) {
    const std::int64_t lo = std::max(begin, start), hi = std::min(end, start + numels[k]);
    if (lo < hi) pieces.push_back({k, lo - start, lo - begin, hi - lo});
    start += numels[k];
  }
  return pieces;
  // END EXERCISE 07.1
}

}  // namespace course::chapter07
