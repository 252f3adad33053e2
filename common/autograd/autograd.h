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

// Backpropagates from `root`. With no `grad_output` the root must be a one-element loss (its gradient
// is 1); a pipeline stage instead passes the gradient of its output, received from the next stage.
// Leaf gradients accumulate (+=) into .grad; each leaf's post-accumulate hooks fire as soon as its
// last contribution of this pass has been added, which is what lets DDP start communicating a
// bucket while backward is still running (chapter 05). The graph is freed afterwards, then the
// callbacks queued during this pass run, in the order they were queued.
void backward(const Tensor& root, const Tensor& grad_output = Tensor());

// Queues `callback` to run once the backward pass in progress has finished (PyTorch's
// Engine.queue_callback): how a hook learns that backward is over without counting gradients.
// Callable only from inside backward (from a hook); throws std::logic_error elsewhere.
void queue_callback(std::function<void()> callback);

}  // namespace autograd
}  // namespace course
