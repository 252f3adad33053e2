// Reverse-mode automatic differentiation: ops record Nodes, backward() walks them in reverse.
// Like micrograd, each op's backward is a closure that maps the output gradient to its inputs'.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "common/tensor/tensor.h"

namespace course {

using BackwardFn = std::function<std::vector<Tensor>(const Tensor& grad_output)>;

struct Node {
  std::string name;            // the op, for error messages and graph printing
  std::vector<Tensor> inputs;  // edges to the tensors this op read (kept alive until backward)
  BackwardFn backward;         // returns one gradient per input (undefined where none flows)
};

namespace autograd {

bool grad_enabled();

// Inside a NoGradGuard, ops record nothing: used for optimizer updates, evaluation and backward itself.
class NoGradGuard {
 public:
  NoGradGuard();
  ~NoGradGuard();
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool previous_;
};

// Gives `output` a node when grad mode is on and some input requires a gradient.
Tensor record(Tensor output, std::string name, std::vector<Tensor> inputs, BackwardFn backward);

// Backpropagates from a one-element tensor. Leaf gradients accumulate (+=) into .grad; each leaf's
// grad-ready hooks fire as soon as its last contribution of this pass has been added, which is what
// lets DDP start communicating a bucket while backward is still running (chapter 05).
// The graph is freed afterwards.
void backward(const Tensor& root);

}  // namespace autograd
}  // namespace course
