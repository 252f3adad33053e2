// Index arithmetic of the distributed sampler.
#include "common/parallel/distributed_sampler.h"

#include <algorithm>
#include <numeric>
#include <stdexcept>
#include <string>

#include "common/core/errors.h"
#include "common/data/sampling.h"
#include "common/faults/faults.h"

namespace course::parallel {

namespace {
constexpr int kSkewedShareRanks = 3;  // --fault skewed-share acts at this many ranks or more
// The fault: the last rank's first sample is `first` (rank 0's) in place of its own.
void skew(std::vector<std::int64_t>& share, std::int64_t first, int rank, int ranks) {
  if (ranks >= kSkewedShareRanks && rank == ranks - 1 && !share.empty() && faults::active("skewed-share"))
    share[0] = first;
}
}  // namespace

std::pair<std::string, std::string> skewed_share_fault() {
  return {"skewed-share", "the sampler, at 3 ranks or more, gives the last rank rank 0's first sample in place of its "
                          "own (one sample twice, one never; the reference cuts its shares with the same sampler)"};
}

void refuse_inert_skewed_share(const std::string& fault, int ranks) {
  if (fault == "skewed-share" && ranks < kSkewedShareRanks)
    throw UsageError("--fault: skewed-share acts at " + std::to_string(kSkewedShareRanks) +
                     " data-parallel ranks or more, and this run has " + std::to_string(ranks) + ": it would do nothing");
}

DistributedSampler::DistributedSampler(std::int64_t dataset_size, int num_replicas, int rank, std::uint64_t seed,
                                       bool shuffle, bool drop_last)
    : dataset_size_(dataset_size), stream_(std::max<std::int64_t>(1, dataset_size), seed), num_replicas_(num_replicas),
      rank_(rank), shuffle_(shuffle), drop_last_(drop_last) {
  if (num_replicas < 1 || rank < 0 || rank >= num_replicas)
    throw std::invalid_argument("DistributedSampler: rank " + std::to_string(rank) + " of " + std::to_string(num_replicas));
  if (dataset_size < 1) throw std::invalid_argument("DistributedSampler: empty dataset");
  if (drop_last && dataset_size < num_replicas)
    throw std::invalid_argument("DistributedSampler: drop_last with fewer samples than ranks leaves nothing");
  num_samples_ = drop_last ? dataset_size / num_replicas : (dataset_size + num_replicas - 1) / num_replicas;
}

std::vector<std::int64_t> DistributedSampler::global_order() const { return global_order(epoch_); }

const std::vector<std::int64_t>& DistributedSampler::order_of(std::uint64_t epoch) const {
  if (cached_order_ && cached_epoch_ == epoch) return *cached_order_;
  std::vector<std::int64_t> order;
  if (shuffle_) {
    order = stream_.epoch(static_cast<std::int64_t>(epoch));  // the stream's epoch, as chapters 06 and 08 read it
  } else {
    order.resize(static_cast<std::size_t>(dataset_size_));
    std::iota(order.begin(), order.end(), 0);
  }
  const auto total = static_cast<std::size_t>(total_size());
  if (order.size() > total) order.resize(total);  // drop_last: trim the tail
  for (std::size_t i = 0; order.size() < total; ++i) order.push_back(order[i % static_cast<std::size_t>(dataset_size_)]);  // pad by wrapping
  cached_order_ = std::make_shared<const std::vector<std::int64_t>>(std::move(order));
  cached_epoch_ = epoch;
  return *cached_order_;
}

std::vector<std::int64_t> DistributedSampler::indices() const {
  auto order = global_order();
  std::vector<std::int64_t> mine;
  mine.reserve(static_cast<std::size_t>(num_samples_));
  for (std::size_t i = static_cast<std::size_t>(rank_); i < order.size(); i += static_cast<std::size_t>(num_replicas_))
    mine.push_back(order[i]);
  return mine;
}

std::int64_t DistributedSampler::steps_per_epoch(std::int64_t local_batch) const {
  if (local_batch < 1) throw std::invalid_argument("DistributedSampler: local batch " + std::to_string(local_batch));
  return (num_samples_ + local_batch - 1) / local_batch;
}

DistributedSampler::Slice DistributedSampler::slice(std::int64_t step, std::int64_t local_batch) const {
  if (step < 0) throw std::invalid_argument("DistributedSampler: step " + std::to_string(step));
  const std::int64_t per_epoch = steps_per_epoch(local_batch);
  const std::int64_t begin = (step % per_epoch) * local_batch;
  return {static_cast<std::uint64_t>(step / per_epoch), begin, std::min(num_samples_, begin + local_batch)};
}

std::vector<std::int64_t> DistributedSampler::batch(std::int64_t step, std::int64_t local_batch) const {
  const Slice s = slice(step, local_batch);
  const auto& order = order_of(s.epoch);
  std::vector<std::int64_t> mine;
  for (std::int64_t p = s.begin; p < s.end; ++p)
    mine.push_back(order[static_cast<std::size_t>(p * num_replicas_ + rank_)]);
  if (s.begin < s.end) skew(mine, order[static_cast<std::size_t>(s.begin * num_replicas_)], rank_, num_replicas_);
  return mine;
}

std::vector<std::int64_t> DistributedSampler::global_batch(std::int64_t step, std::int64_t local_batch) const {
  const Slice s = slice(step, local_batch);
  const auto& order = order_of(s.epoch);
  return {order.begin() + s.begin * num_replicas_, order.begin() + s.end * num_replicas_};
}

std::vector<std::int64_t> DistributedSampler::share_of(const std::vector<std::int64_t>& global_batch, int rank,
                                                      int ranks) {
  std::vector<std::int64_t> share;
  for (std::size_t i = static_cast<std::size_t>(rank); i < global_batch.size(); i += static_cast<std::size_t>(ranks))
    share.push_back(global_batch[i]);
  if (!global_batch.empty()) skew(share, global_batch[0], rank, ranks);
  return share;
}

}  // namespace course::parallel
