// What a data-parallel wrapper says about its communication, the same for chapter 04's
// DataParallelNaive and for DistributedDataParallel, so that chapter 05 times them side by side.
#pragma once
#include <cstddef>
#include <cstdint>

namespace course::parallel {

struct CommStats {
  std::size_t messages_per_step = 0;  // all-reduces a step sends: one per parameter, or one per bucket
  std::int64_t bytes = 0;             // sent by this rank since construction
  double exposed_ms = 0;              // the last step's communication that backward did not hide (ms)
};

}  // namespace course::parallel
