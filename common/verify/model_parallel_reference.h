// The reference of a 16-bit run that splits its model across ranks (tensor and context parallelism),
// micro-batch by micro-batch. In 16 bits a split layer rounds otherwise than the whole one: each TP
// rank's partial product is rounded to 16 bits before the ranks add them, and a row layer's bias is
// added after that sum, not inside one product; a context-parallel rank's attention adds the key-value
// blocks of the others in the ring's order. So the whole model cannot compute a micro-batch's gradient
// as the run does, and no bound of float32 sums describes the difference (a lost micro-batch hides
// within a few noise floors of it). This reference computes it as the run does: the run's own split
// modules, one for each TP x CP rank, each on a thread of this process over in-process groups
// (verify/local_group.h) whose sums of two ranks are the run's value for value. A micro-batch's gradient
// is then the run's, bit for bit, and lock-step's check by parts applies: only the sums over
// micro-batches, context-parallel ranks and replicas differ, within their bound (lockstep.h). With more
// than two TP ranks the sums agree because the run's TP group adds in the ring's order, float32 and
// 16-bit alike (Communicator::add_in_ring_order), as the in-process groups do; NCCL's ring adds in an
// order of its own, which no reference follows.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/verify/local_group.h"
#include "common/nn/module.h"
#include "common/parallel/context_parallel.h"
#include "common/parallel/tensor_parallel.h"

namespace course::verify {

class ModelParallelReference {
 public:
  // Makes one rank's part of the model over its TP group, its attention through `cp` (null without
  // context parallelism); on that rank's thread.
  using Make = std::function<std::shared_ptr<parallel::TensorParallelModule>(comm::Communicator& tp,
                                                                             const parallel::ContextParallel* cp)>;
  // Forward and backward of one part of the step on a rank's part of the model; returns its loss.
  using Backward = std::function<float(parallel::TensorParallelModule& part)>;

  // tp x cp parts made by `make` (cp > 1: over a ContextParallel of `method`); `whole`: the whole model
  // (names, shapes, order) whose gradients backward() writes; `sequence_parallel`: each part's unsplit
  // parameters saw its shard of the sequence, and their gradients are summed over the TP group after
  // backward.
  ModelParallelReference(int tp, int cp, parallel::ContextMethod method, const Make& make, const nn::Module& whole,
                         bool sequence_parallel);

  // One part of the step, context-parallel rank `cp_rank`'s: every rank's part takes `whole`'s
  // parameters, runs `backward` on its thread (under the caller's EmulatedSixteenBits, if one is alive),
  // then parallel::finish_gradients. `whole`'s gradients
  // become those of the TP ranks of `cp_rank` put together (a split element from the part that holds
  // it, the rest from the first, where all agree), and the terms added into each, with their magnitudes,
  // go to the calling thread's verify::ContributionMagnitudes (under sequence parallelism an unsplit
  // parameter's gradient is the sum of every TP rank's terms). Returns that CP rank's loss.
  float backward(nn::Module& whole, const Backward& backward, int cp_rank = 0);

 private:
  struct Slot {  // a parameter of the whole model and its parts
    std::string name;
    bool split = false;
    std::vector<Tensor> parts;                      // each rank's (thread c tp + t)
    std::vector<std::vector<std::int64_t>> places;  // split: where each TP rank's elements lie in the whole
  };
  int tp_, cp_;
  std::shared_ptr<verify::Turns> turns_;
  std::vector<std::unique_ptr<verify::LocalGroup>> tp_groups_, cp_groups_;  // one per CP rank, one per TP rank
  std::vector<std::unique_ptr<parallel::ContextParallel>> attention_;    // each thread's, with cp > 1
  std::vector<std::shared_ptr<parallel::TensorParallelModule>> parts_;   // each thread's
  std::vector<Slot> slots_;
  bool sequence_parallel_;
};

}  // namespace course::verify
