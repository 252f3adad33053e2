// Sample order for any dataset: a seeded shuffle per epoch, and consecutive batches of it.
#pragma once
#include <cstdint>
#include <vector>

namespace course::data {

// The indices 0..n-1 in an order that depends only on (seed, epoch): a Fisher-Yates shuffle
// driven by the counter-based generator, so any rank can recompute any epoch's order.
std::vector<std::int64_t> shuffled_indices(std::int64_t n, std::uint64_t seed, std::uint64_t epoch);

// The endless stream of samples, epoch after epoch, each epoch a shuffle (seed, epoch): position p is
// sample p % n of epoch p / n. The course's one data order: a run that counts how far it got as a global
// sample position resumes it exactly at any world size (chapters 06, 08), and DistributedSampler
// (common/parallel/distributed_sampler.h) is its PyTorch-named view by epochs, whose padding, by
// contrast, depends on the rank count (chapters 04, 05, 07).
class SampleStream {
 public:
  SampleStream(std::int64_t dataset_size, std::uint64_t seed);
  // The samples at positions [position, position + count), crossing into the next epoch if needed.
  std::vector<std::int64_t> take(std::int64_t position, std::int64_t count) const;
  // Epoch `epoch` whole: shuffled_indices(size, seed, epoch), kept until another epoch is asked for.
  const std::vector<std::int64_t>& epoch(std::int64_t epoch) const;
  std::int64_t epoch_of(std::int64_t position) const { return position / size_; }
  std::int64_t size() const { return size_; }
  std::uint64_t seed() const { return seed_; }

 private:
  std::int64_t size_;
  std::uint64_t seed_;
  mutable std::int64_t cached_epoch_ = -1;  // the last epoch's order: one shuffle per epoch, not per step
  mutable std::vector<std::int64_t> cached_order_;
};

// Consecutive slices of `order` of at most `batch_size`; the last one may be shorter.
std::vector<std::vector<std::int64_t>> split_batches(const std::vector<std::int64_t>& order, std::int64_t batch_size);

}  // namespace course::data
