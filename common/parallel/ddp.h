// DistributedDataParallel: the same model on every rank, each on its own share of the batch.
//   1. At construction every parameter is broadcast from rank 0, so ranks start identical even when
//      they were initialised with different seeds.
//   2. Each rank runs forward and backward on its share.
//   3. When backward is over (an end-of-backward callback, queued by the first gradient-ready hook),
//      the gradients are all-reduced and divided by the world size. Averaging makes the update equal to single-rank training on the global batch
//      with a mean loss: the mean of R equal-sized shares' means is the mean of the whole.
//   4. Every rank applies the same update to the same parameters, so they stay identical.
// Inside no_sync() the all-reduce is skipped and gradients accumulate locally (gradient
// accumulation's micro-steps); the first backward outside it synchronises the sum.
// Li et al., "PyTorch Distributed: Experiences on Accelerating Data Parallel Training", VLDB 2020.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/comm/communicator.h"
#include "common/nn/module.h"
#include "common/parallel/comm_stats.h"
#include "common/parallel/reducer.h"

namespace course::parallel {

class DistributedDataParallel {
 public:
  // `group` is the data-parallel group (Topology::dp_group()); under pure data parallelism, the world.
  // The options choose how gradients travel (reducer.h): by default in overlapped buckets, as PyTorch.
  DistributedDataParallel(std::shared_ptr<nn::Module> module, comm::Communicator& group, ReducerOptions options = {});

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

  // How a bucket of gradients is synchronised (PyTorch's register_comm_hook), see reducer.h.
  void register_comm_hook(CommHook hook) { reducer_.register_comm_hook(std::move(hook)); }
  Reducer& reducer() { return reducer_; }

  // True when every rank of the group holds bit-identical parameters (parallel::parameters_identical).
  bool parameters_identical();

  // How many times the gradients were synchronised (once per backward outside no_sync).
  long synchronisations() const { return synchronisations_; }
  // One all-reduce per bucket; the bytes sent; the last backward's exposed communication, by the
  // reducer's one clock (its last_timeline() has the buckets' times).
  CommStats stats() const {
    return {reducer_.buckets().size(), reducer_.bytes_communicated(), reducer_.exposed_ms()};
  }

 private:
  void on_gradient_ready(std::size_t index);
  void finish_backward();

  std::shared_ptr<nn::Module> module_;
  comm::Communicator& comm_;
  std::vector<Tensor> parameters_;
  Reducer reducer_;
  bool pass_started_ = false;  // a gradient became ready in this pass: the end-of-backward callback is queued
  bool sync_enabled_ = true;
  long synchronisations_ = 0;
};

}  // namespace course::parallel
