// Sample order for any dataset: a seeded shuffle per epoch, and consecutive batches of it.
#pragma once
#include <cstdint>
#include <vector>

namespace course::data {

// The indices 0..n-1 in an order that depends only on (seed, epoch): a Fisher-Yates shuffle
// driven by the counter-based generator, so any rank can recompute any epoch's order.
std::vector<std::int64_t> shuffled_indices(std::int64_t n, std::uint64_t seed, std::uint64_t epoch);

// Consecutive slices of `order` of at most `batch_size`; the last one may be shorter.
std::vector<std::vector<std::int64_t>> split_batches(const std::vector<std::int64_t>& order, std::int64_t batch_size);

}  // namespace course::data
