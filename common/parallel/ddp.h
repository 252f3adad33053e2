// DistributedDataParallel: the same model on every rank, each on its own share of the batch.
//   1. At construction every parameter is broadcast from rank 0, so ranks start identical even when
//      they were initialised with different seeds.
//   2. Each rank runs forward and backward on its share.
//   3. When backward has produced the last gradient, the gradients are all-reduced and divided by
//      the world size. Averaging makes the update equal to single-rank training on the global batch
//      with a mean loss: the mean of R equal-sized shares' means is the mean of the whole.
//   4. Every rank applies the same update to the same parameters, so they stay identical.
// Inside no_sync() the all-reduce is skipped and gradients accumulate locally (gradient
// accumulation's micro-steps); the first backward outside it synchronises the sum.
// Li et al., "PyTorch Distributed: Experiences on Accelerating Data Parallel Training", VLDB 2020.
#pragma once
#include <functional>
#include <memory>

#include "common/comm/communicator.h"
#include "common/nn/module.h"

namespace course::parallel {

class DistributedDataParallel {
 public:
  DistributedDataParallel(std::shared_ptr<nn::Module> module, comm::Communicator& comm);

  Tensor forward(const Tensor& x);
  Tensor operator()(const Tensor& x) { return forward(x); }
  nn::Module& module() { return *module_; }
  comm::Communicator& communicator() { return comm_; }

  class NoSyncGuard {
   public:
    explicit NoSyncGuard(DistributedDataParallel& ddp) : ddp_(ddp), previous_(ddp.sync_enabled_) { ddp.sync_enabled_ = false; }
    ~NoSyncGuard() { ddp_.sync_enabled_ = previous_; }
    NoSyncGuard(const NoSyncGuard&) = delete;
    NoSyncGuard& operator=(const NoSyncGuard&) = delete;

   private:
    DistributedDataParallel& ddp_;
    bool previous_;
  };
  NoSyncGuard no_sync() { return NoSyncGuard(*this); }

  // A checksum of this rank's parameters, gathered from every rank: true when all are bit-identical.
  bool parameters_identical();
  std::uint64_t parameter_checksum() const;

  // Wall time spent in gradient all-reduces since the last call (milliseconds), and their count.
  double take_communication_ms();
  long synchronisations() const { return synchronisations_; }

 private:
  void on_gradient_ready();
  void synchronise_gradients();

  std::shared_ptr<nn::Module> module_;
  comm::Communicator& comm_;
  std::vector<Tensor> parameters_;
  std::size_t ready_ = 0;      // gradients completed in the current backward pass
  bool sync_enabled_ = true;
  double communication_ms_ = 0;
  long synchronisations_ = 0;
};

// Runs `work` on rank 0 only (saving, statistics); with `wait`, the other ranks wait for it.
void on_rank0(comm::Communicator& comm, const std::function<void()>& work, bool wait = false);

}  // namespace course::parallel
