// The reference of a 16-bit tensor-parallel run, micro-batch by micro-batch. In 16 bits a split layer
// rounds otherwise than the whole one: each rank's partial product is rounded to 16 bits before the
// ranks add them, and a row layer's bias is added after that sum, not inside one product. So the whole
// model cannot compute a micro-batch's gradient as the run does, and no bound of float32 sums describes
// the difference (a lost micro-batch hides within a few noise floors of it). This reference computes it
// as the run does: the run's own split modules, one for each TP rank, each on a thread of this process
// over an in-process group (comm/local_group.h), whose sums of two ranks are the run's value for value.
// A micro-batch's gradient is then the run's, bit for bit, and lock-step's check by parts applies: only
// the sums over micro-batches and replicas differ, within their bound (lockstep.h). With more than two
// TP ranks MPI adds the 16-bit partial products in an order of its own, and no reference follows it.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/comm/local_group.h"
#include "common/nn/module.h"
#include "common/parallel/tensor_parallel.h"

namespace course::verify {

class TensorParallelReference {
 public:
  // Makes this TP rank's part of the model over `tp` (on the rank's thread).
  using Make = std::function<std::shared_ptr<parallel::TensorParallelModule>(comm::Communicator& tp)>;
  // Forward and backward of one part of the step on a TP rank's part of the model; returns its loss.
  using Backward = std::function<float(parallel::TensorParallelModule& part)>;

  // `tp` parts made by `make`; `whole`: the whole model (names, shapes, order) whose gradients backward()
  // writes; `sequence_parallel`: each part's unsplit parameters saw its shard of the sequence, and their
  // gradients are summed over the group after backward.
  TensorParallelReference(int tp, const Make& make, const nn::Module& whole, bool sequence_parallel);

  // One part of the step: each TP rank's part takes `whole`'s parameters, runs `backward` on its thread,
  // then parallel::finish_gradients. `whole`'s gradients become the parts' put together (a split
  // element from the part that holds it, the rest from the first part, where all agree), and the terms
  // added into each, with their magnitudes, go to the calling thread's autograd::ContributionMagnitudes
  // (under sequence parallelism an unsplit parameter's gradient is the sum of every rank's terms).
  // Returns the loss, the same on every part.
  float backward(nn::Module& whole, const Backward& backward);

 private:
  struct Slot {  // a parameter of the whole model and its parts
    std::string name;
    Tensor whole;
    std::vector<Tensor> parts;  // each TP rank's
    bool split = false;
    std::vector<std::vector<std::int64_t>> places;  // split: where each part's elements lie in the whole
  };
  comm::LocalGroup group_;
  std::vector<std::shared_ptr<parallel::TensorParallelModule>> parts_;
  std::vector<Slot> slots_;
  bool sequence_parallel_;
};

}  // namespace course::verify
