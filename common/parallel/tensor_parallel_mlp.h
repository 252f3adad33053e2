// The course's MLP (nn::make_mlp: Linear, activation, Linear, ..., Linear) split across a
// tensor-parallel group as Megatron-LM splits a transformer's MLP (Shoeybi et al. 2019, section 3):
// its linear layers taken in pairs, the first of each pair column-parallel and the second
// row-parallel, so each slice of the hidden layer stays on its rank and a pair costs one all-reduce
// forward (g) and one backward (f). The activation between the two runs on the slice (it acts element
// by element, so it commutes with the split). A linear layer left over at the end (the house-price
// MLP's ninth, 256 -> 1) stays whole on every rank: its input is whole after the pair before it, so
// its output and its gradients are the same on every rank.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/nn/layers.h"
#include "common/parallel/tensor_parallel.h"

namespace course::parallel {

class TensorParallelMLP : public TensorParallelModule {
 public:
  // This rank's part of `full`, which every rank made with the same seed. Its parameters keep full's
  // names ("0.weight", ...). Throws UsageError naming the layer whose width does not divide by the group.
  TensorParallelMLP(const nn::Sequential& full, comm::Communicator& tp);
  Tensor forward(const Tensor& x) override;
  bool is_split(const std::string& name) const override;
  bool counts_once(const std::string& name) const override { return tp_.size() == 1 || is_split(name) || tp_.rank() == 0; }
  Tensor part_of(const std::string& name, const Tensor& whole) const override;

 private:
  comm::Communicator& tp_;
  std::vector<std::shared_ptr<nn::Module>> layers_;
  std::map<std::string, int> cut_;  // a split parameter's name -> the dimension it is cut along
};

}  // namespace course::parallel
