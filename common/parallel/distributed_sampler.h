// DistributedSampler: each data-parallel rank's share of the dataset's indices, as in PyTorch's
// torch.utils.data.DistributedSampler, a view by epochs of the course's one sample stream
// (data::SampleStream, common/data/sampling.h). One epoch's order (the stream's epoch) is padded by
// wrapping around, or trimmed with drop_last, to a multiple of the rank count; rank r takes every
// R-th index from position r. So the shares are disjoint (up to the padding), together cover the
// dataset, and every rank gets the same number of samples and therefore of batches.
//
// Training is counted in steps: step s is batch s % steps_per_epoch() of epoch s / steps_per_epoch(),
// and batch(s) is this rank's share of it, global_batch(s) the union of every rank's share (what a
// single-rank run must see to compute the same step).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/comm/communicator.h"
#include "common/data/sampling.h"

namespace course::parallel {

class DistributedSampler {
 public:
  DistributedSampler(std::int64_t dataset_size, int num_replicas, int rank, std::uint64_t seed = 0,
                     bool shuffle = true, bool drop_last = false);
  // One replica per rank of the data-parallel group (Topology::dp_group()).
  DistributedSampler(std::int64_t dataset_size, const comm::Communicator& group, std::uint64_t seed = 0,
                     bool shuffle = true, bool drop_last = false)
      : DistributedSampler(dataset_size, group.size(), group.rank(), seed, shuffle, drop_last) {}

  int num_replicas() const { return num_replicas_; }
  int rank() const { return rank_; }

  void set_epoch(std::uint64_t epoch) { epoch_ = epoch; }
  std::int64_t num_samples() const { return num_samples_; }  // per rank, per epoch
  std::int64_t total_size() const { return num_samples_ * num_replicas_; }

  // This rank's indices for the current epoch, in order.
  std::vector<std::int64_t> indices() const;
  // The whole epoch, padded or trimmed, in global order: rank r's share is positions r, r+R, ...
  // A single-rank run that takes batches of R*b consecutive positions of this order sees exactly
  // the union of the ranks' batches of b, which is what the DDP equivalence test relies on.
  std::vector<std::int64_t> global_order() const;

  // Step-indexed batches of `local_batch` samples per rank; the last batch of an epoch may be shorter.
  // They do not depend on set_epoch: the step says which epoch.
  std::int64_t steps_per_epoch(std::int64_t local_batch) const;
  std::vector<std::int64_t> batch(std::int64_t step, std::int64_t local_batch) const;
  // Every rank's share of the step, as global positions [p*R, (p+b)*R) of the epoch's global order,
  // so rank r's samples are the entries r, r+R, ... of it.
  std::vector<std::int64_t> global_batch(std::int64_t step, std::int64_t local_batch) const;
  // Rank r's samples within a global batch: its entries r, r+R, r+2R, ... (what batch() gives rank r).
  static std::vector<std::int64_t> share_of(const std::vector<std::int64_t>& global_batch, int rank, int ranks);

 private:
  std::int64_t dataset_size_;
  data::SampleStream stream_;  // each epoch's order, when shuffled
  int num_replicas_, rank_;
  bool shuffle_, drop_last_;
  std::uint64_t epoch_ = 0;
  std::int64_t num_samples_;

  // The epoch's order, computed once per epoch and kept: shuffling a dataset of millions of windows
  // (a character model's text) takes tens of milliseconds, too much to pay at every step.
  const std::vector<std::int64_t>& order_of(std::uint64_t epoch) const;
  mutable std::shared_ptr<const std::vector<std::int64_t>> cached_order_;
  mutable std::uint64_t cached_epoch_ = 0;
  std::vector<std::int64_t> global_order(std::uint64_t epoch) const { return order_of(epoch); }
  struct Slice {
    std::uint64_t epoch;
    std::int64_t begin, end;  // this step's positions in each rank's share
  };
  Slice slice(std::int64_t step, std::int64_t local_batch) const;
};

// --fault skewed-share, a bug of the sampler itself (batch() and share_of() alike, so a run and a reference
// that both cut their shares here make the same mistake): at 3 ranks or more the last rank takes rank 0's
// first sample in place of its own, as a sampler wrong only at a resume's new world size would. What it
// breaks, for a chapter's --fault help; and a UsageError naming --fault where the data-parallel group has
// `ranks` < 3, where it would do nothing.
std::pair<std::string, std::string> skewed_share_fault();
void refuse_inert_skewed_share(const std::string& fault, int ranks);

}  // namespace course::parallel
