// Chapter 05's bucket assignment, the exercise of the chapter (05.1): which gradients travel together.
// Every mode of the chapter hands it to the Reducer (ReducerOptions::assign_buckets); the library keeps
// its own (parallel::assign_buckets_by_size, for every other user of DistributedDataParallel), which the
// graded tests hold this one against (tests/buckets_exercise_test.cpp).
#pragma once
#include <cstddef>
#include <vector>

namespace course::chapter05 {

// The contract of parallel::BucketAssignment (common/parallel/reducer.h): the parameters taken in
// `order`, a new bucket whenever the next would take a non-empty one past its cap (the first bucket's
// `first_cap`, later ones' `cap`, in bytes; `bytes[i]` is parameter i's gradient). Returns the buckets.
std::vector<std::vector<std::size_t>> assign_buckets(const std::vector<std::size_t>& order,
                                                     const std::vector<std::size_t>& bytes, std::size_t first_cap,
                                                     std::size_t cap);

}  // namespace course::chapter05
