// Shuffling and splitting sample indices.
#include "common/data/sampling.h"

#include <algorithm>
#include <stdexcept>
#include <utility>

#include "common/tensor/random.h"

namespace course::data {
namespace {
constexpr std::uint64_t kShuffleStream = 4;  // the generator stream that only shuffling uses
}  // namespace

std::vector<std::int64_t> shuffled_indices(std::int64_t n, std::uint64_t seed, std::uint64_t epoch) {
  std::vector<std::int64_t> order(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) order[static_cast<std::size_t>(i)] = i;
  std::uint64_t s = random_bits(random_bits(seed, kShuffleStream), epoch);
  for (std::int64_t i = n - 1; i > 0; --i) {
    auto j = static_cast<std::int64_t>(random_bits(s, static_cast<std::uint64_t>(i)) % static_cast<std::uint64_t>(i + 1));
    std::swap(order[static_cast<std::size_t>(i)], order[static_cast<std::size_t>(j)]);
  }
  return order;
}

const std::vector<std::int64_t>& SampleStream::epoch(std::int64_t epoch) const {
  if (epoch < 0) throw std::invalid_argument("SampleStream: negative epoch");
  if (epoch != cached_epoch_) {
    cached_order_ = shuffled_indices(size_, seed_, static_cast<std::uint64_t>(epoch));
    cached_epoch_ = epoch;
  }
  return cached_order_;
}

std::vector<std::vector<std::int64_t>> split_batches(const std::vector<std::int64_t>& order, std::int64_t batch_size) {
  if (batch_size < 1) throw std::invalid_argument("batch size must be at least 1");
  std::vector<std::vector<std::int64_t>> batches;
  for (std::size_t start = 0; start < order.size(); start += static_cast<std::size_t>(batch_size)) {
    std::size_t end = std::min(order.size(), start + static_cast<std::size_t>(batch_size));
    batches.emplace_back(order.begin() + static_cast<std::ptrdiff_t>(start), order.begin() + static_cast<std::ptrdiff_t>(end));
  }
  return batches;
}

SampleStream::SampleStream(std::int64_t dataset_size, std::uint64_t seed) : size_(dataset_size), seed_(seed) {
  if (dataset_size < 1) throw std::invalid_argument("SampleStream: empty dataset");
}

std::vector<std::int64_t> SampleStream::take(std::int64_t position, std::int64_t count) const {
  if (position < 0 || count < 0) throw std::invalid_argument("SampleStream: negative position or count");
  std::vector<std::int64_t> out;
  out.reserve(static_cast<std::size_t>(count));
  for (std::int64_t p = position; p < position + count; ++p) out.push_back(epoch(p / size_)[static_cast<std::size_t>(p % size_)]);
  return out;
}

}  // namespace course::data
