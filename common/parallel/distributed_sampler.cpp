// Index arithmetic of the distributed sampler.
#include "common/parallel/distributed_sampler.h"

#include <numeric>
#include <stdexcept>
#include <string>

#include "common/data/house_prices.h"

namespace course::parallel {

DistributedSampler::DistributedSampler(std::int64_t dataset_size, int num_replicas, int rank, std::uint64_t seed,
                                       bool shuffle, bool drop_last)
    : dataset_size_(dataset_size), num_replicas_(num_replicas), rank_(rank), seed_(seed), shuffle_(shuffle),
      drop_last_(drop_last) {
  if (num_replicas < 1 || rank < 0 || rank >= num_replicas)
    throw std::invalid_argument("DistributedSampler: rank " + std::to_string(rank) + " of " + std::to_string(num_replicas));
  if (dataset_size < 1) throw std::invalid_argument("DistributedSampler: empty dataset");
  if (drop_last && dataset_size < num_replicas)
    throw std::invalid_argument("DistributedSampler: drop_last with fewer samples than ranks leaves nothing");
  num_samples_ = drop_last ? dataset_size / num_replicas : (dataset_size + num_replicas - 1) / num_replicas;
}

std::vector<std::int64_t> DistributedSampler::global_order() const {
  std::vector<std::int64_t> order;
  if (shuffle_) {
    order = data::shuffled_indices(dataset_size_, seed_, epoch_);
  } else {
    order.resize(static_cast<std::size_t>(dataset_size_));
    std::iota(order.begin(), order.end(), 0);
  }
  const auto total = static_cast<std::size_t>(total_size());
  if (order.size() > total) order.resize(total);  // drop_last: trim the tail
  for (std::size_t i = 0; order.size() < total; ++i) order.push_back(order[i % static_cast<std::size_t>(dataset_size_)]);  // pad by wrapping
  return order;
}

std::vector<std::int64_t> DistributedSampler::indices() const {
  auto order = global_order();
  std::vector<std::int64_t> mine;
  mine.reserve(static_cast<std::size_t>(num_samples_));
  for (std::size_t i = static_cast<std::size_t>(rank_); i < order.size(); i += static_cast<std::size_t>(num_replicas_))
    mine.push_back(order[i]);
  return mine;
}

void DistributedSampler::load_state(const State& state) {
  if (state.position < 0 || state.position > num_samples_)
    throw std::invalid_argument("DistributedSampler: position " + std::to_string(state.position) + " outside the epoch");
  epoch_ = state.epoch;
  position_ = state.position;
}

}  // namespace course::parallel
