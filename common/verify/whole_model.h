// The whole model's parameters (or gradients) put back together from the parts that the ranks of a
// TP x PP x DP grid hold, for a lock-step reference that works on the whole model (verify/lockstep.h).
// Each rank writes the elements of the one copy it is responsible for into a zero vector of the whole
// model, at the places its part came from, and the vectors are added onto rank 0: a sum of one value
// and zeros, so exact. Where a part came from is learnt once, from the part's own rule
// (TensorParallelModule::part_of applied to the whole tensor's element indices), so there is no second
// copy of how tensor parallelism cuts a layer.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/comm/communicator.h"
#include "common/nn/module.h"
#include "common/parallel/tensor_parallel.h"

namespace course::verify {

using parallel::TensorParallelModule;

// Where each element of `part`'s parameter `name` lies in the whole model's tensor of that name (of
// `whole_shape`), as an index into that tensor: learnt from part_of itself.
std::vector<std::int64_t> places_in_whole(const TensorParallelModule& part, const std::string& name,
                                          const Shape& whole_shape, Device device);

class WholeModelGather {
 public:
  // `part`: this rank's part of the model, its parameters named as the whole model's; `whole`: a model of
  // the whole architecture (its names, shapes and order); `responsible(name)`: whether this rank's copy
  // of `name` is the one the whole takes (exactly one copy of every element across `world`).
  WholeModelGather(const TensorParallelModule& part, const nn::Module& whole, comm::Communicator& world,
                   const std::function<bool(const std::string&)>& responsible);
  // Collective over the world; the whole vector, in `whole`'s order, on rank 0 (empty elsewhere).
  std::vector<float> parameters() { return assemble(false); }
  std::vector<float> gradients() { return assemble(true); }  // zeros where a part has none

 private:
  std::vector<float> assemble(bool gradients);
  struct Piece {
    Tensor parameter;                  // this rank's part
    std::vector<std::int64_t> places;  // where each of its elements lies in the whole vector
  };
  std::vector<Piece> pieces_;
  std::int64_t total_ = 0;
  comm::Communicator& world_;
  Device device_;
};

}  // namespace course::verify
