// Chapter 04's data parallelism, whole: broadcast the parameters once, then after every backward
// all-reduce each gradient and divide by the number of ranks. Picotron's DataParallelNaive; chapter 05
// times it beside its buckets (its "per-parameter" mode) and then does the same work in fewer, larger,
// overlapped messages (common/parallel/ddp.h, PyTorch's DistributedDataParallel).
//
// Why the average: each rank's loss is the mean over its equal share of the global batch, so the mean
// of the R ranks' gradients is the gradient of the mean loss over the whole batch, which is what one
// rank would have computed. Every rank then applies the same update to the same parameters, and the
// replicas stay identical without ever sending a parameter again.
#pragma once
#include <chrono>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <utility>
#include <vector>

#include "common/comm/communicator.h"
#include "common/core/exercise.h"  // exercise::not_done: the participant's copy stops at an unwritten one
#include "common/nn/module.h"
#include "common/parallel/comm_hooks.h"  // CommHook: how one gradient travels (the default all-reduces)
#include "common/parallel/comm_stats.h"  // what stats() says, as DistributedDataParallel
#include "common/parallel/replicas.h"    // parameters_identical

namespace course::chapter04 {

class DataParallelNaive {
 public:
  // `group` is every rank that holds a replica (pure data parallelism: the world). `reduce_dtype`: the
  // type the average is taken in (--reduce-dtype; bf16 or fp16 send half the bytes, comm_hooks.h).
  DataParallelNaive(std::shared_ptr<nn::Module> module, comm::Communicator& group, DType reduce_dtype = DType::float32)
      : module_(std::move(module)), group_(group), parameters_(module_->parameters()),
        hook_(parallel::average_hook(reduce_dtype)) {
    broadcast_parameters();  // once, before training
  }

  nn::Module& module() { return *module_; }
  comm::Communicator& communicator() { return group_; }

  // After the last backward of the step (gradient accumulation's micro-batches just add into .grad
  // first): one all-reduce per gradient, each finished before the next starts. The hook does the
  // all-reduce and the division (ReduceOp::average); chapter 05's hooks send it in 16 bits.
  void all_reduce_gradients() {
    const auto begin = std::chrono::steady_clock::now();
    const std::int64_t bytes_before = group_.bytes_sent();
    average_gradients();
    bytes_ += group_.bytes_sent() - bytes_before;
    communication_ms_ = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - begin).count();
  }

  // PyTorch's register_comm_hook, here per gradient: what to do instead of the plain average.
  void register_comm_hook(parallel::CommHook hook) { hook_ = std::move(hook); }

  // True when every rank holds bit-identical parameters. Collective.
  bool parameters_identical() { return parallel::parameters_identical(group_, parameters_); }

  // One all-reduce per parameter; the bytes sent since construction; the last all_reduce_gradients'
  // time, all of it exposed (nothing overlaps it).
  parallel::CommStats stats() const { return {parameters_.size(), bytes_, communication_ms_}; }

 private:
  // EXERCISE 04.1: broadcast once.
  // Make every rank's parameters (parameters_, in the same order on every rank) rank 0's, whatever seed
  // each rank initialised with: group_.broadcast(tensor, root) sends the root's values into every
  // rank's tensor. From then on the identical updates keep the replicas identical, so this runs once.
  // Graded by ex04.1.
  void broadcast_parameters() {
    // BEGIN EXERCISE 04.1
    for (Tensor& p : parameters_) group_.broadcast(p, 0);
    // END EXERCISE 04.1
  }

  // EXERCISE 04.1: average every gradient.
  // After backward each parameter's p.grad() holds this rank's gradient; afterwards it must hold the
  // mean over the ranks. hook_(group_, gradient) starts that all-reduce (ReduceOp::average, in the
  // run's --reduce-dtype: comm_hooks.h) and returns the work to wait() for; wait for each before the
  // next starts, so that every rank runs the same collectives in the same order. A parameter without a
  // gradient would leave the other ranks waiting: throw std::logic_error naming DataParallelNaive.
  // Hint: p.grad() is a view of the gradient, not a copy. Graded by ex04.1 (and 04's --verify).
  void average_gradients() {
    // BEGIN EXERCISE 04.1
    for (Tensor& p : parameters_) {
      Tensor gradient = p.grad();
      if (!gradient.defined()) throw std::logic_error("DataParallelNaive: a parameter received no gradient");
      hook_(group_, gradient)->wait();
    }
    // END EXERCISE 04.1
  }

  std::shared_ptr<nn::Module> module_;
  comm::Communicator& group_;
  std::vector<Tensor> parameters_;
  parallel::CommHook hook_;
  double communication_ms_ = 0;
  std::int64_t bytes_ = 0;
};

}  // namespace course::chapter04
