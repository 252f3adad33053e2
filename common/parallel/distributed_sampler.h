// DistributedSampler: each data-parallel rank's share of the dataset's indices, as in PyTorch's
// torch.utils.data.DistributedSampler. One epoch's order (shuffled with seed + epoch) is padded by
// wrapping around, or trimmed with drop_last, to a multiple of the rank count; rank r takes every
// R-th index from position r. So the shares are disjoint (up to the padding), together cover the
// dataset, and every rank gets the same number of samples and therefore of batches.
#pragma once
#include <cstdint>
#include <vector>

namespace course::parallel {

class DistributedSampler {
 public:
  DistributedSampler(std::int64_t dataset_size, int num_replicas, int rank, std::uint64_t seed = 0,
                     bool shuffle = true, bool drop_last = false);

  void set_epoch(std::uint64_t epoch) { epoch_ = epoch; }
  std::uint64_t epoch() const { return epoch_; }
  std::int64_t num_samples() const { return num_samples_; }  // per rank, per epoch
  std::int64_t total_size() const { return num_samples_ * num_replicas_; }

  // This rank's indices for the current epoch, in order.
  std::vector<std::int64_t> indices() const;
  // The whole epoch, padded or trimmed, in global order: rank r's share is positions r, r+R, ...
  // A single-rank run that takes batches of R*b consecutive positions of this order sees exactly
  // the union of the ranks' batches of b, which is what the DDP equivalence test relies on.
  std::vector<std::int64_t> global_order() const;

  // What a checkpoint saves to resume mid-epoch (chapter 06): the epoch and how far this rank got.
  struct State {
    std::uint64_t epoch = 0;
    std::int64_t position = 0;  // samples of this epoch already consumed by this rank
  };
  State state() const { return {epoch_, position_}; }
  void load_state(const State& state);
  void advance(std::int64_t samples) { position_ += samples; }  // record progress within the epoch

 private:
  std::int64_t dataset_size_;
  int num_replicas_, rank_;
  std::uint64_t seed_;
  bool shuffle_, drop_last_;
  std::uint64_t epoch_ = 0;
  std::int64_t position_ = 0;
  std::int64_t num_samples_;
};

}  // namespace course::parallel
