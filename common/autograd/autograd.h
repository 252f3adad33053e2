// Reverse-mode automatic differentiation: ops record Nodes, backward() walks them in reverse.
// Like micrograd, each op's backward is a closure that maps the output gradient to its inputs'.
#pragma once
#include <functional>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/tensor/tensor.h"

namespace course {

using BackwardFn = std::function<std::vector<Tensor>(const Tensor& grad_output)>;

// An input of an op, as the graph sees it: the node that computed it, or the leaf itself (a parameter,
// or a pipeline stage's received input) when it is one that wants a gradient. Not the input's values: a
// node keeps what its backward needs in its closure (the saved tensors), and nothing else, so a tensor
// no op saved is freed as soon as the forward drops it (PyTorch's edges likewise point at grad_fn, not
// at the tensor). Under autocast this matters: a cast's float32 source is not kept for the cast's
// backward, which needs only its type.
struct Edge {
  std::shared_ptr<Node> producer;  // the input's grad_fn; null for a leaf
  Tensor leaf;                     // a leaf that requires a gradient; undefined otherwise
  DType dtype = DType::float32;    // the input's type: the gradient flowing to it is cast to it
  bool requires_grad = false;
};

struct Node {
  std::string name;            // the op, for error messages and graph printing
  std::vector<Edge> inputs;    // one per tensor this op read, in the op's order
  BackwardFn backward;         // returns one gradient per input (undefined where none flows)
  // The inputs whose gradients a split backward may leave for later (a weight's: zero-bubble's W);
  // empty for an op that cannot split.
  std::vector<bool> deferrable;
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

// The opposite: ops record again inside it (torch.enable_grad), e.g. a recomputation inside backward.
class EnableGradGuard {
 public:
  EnableGradGuard();
  ~EnableGradGuard();
  EnableGradGuard(const EnableGradGuard&) = delete;
  EnableGradGuard& operator=(const EnableGradGuard&) = delete;

 private:
  bool previous_;
};

// Sees every contribution to a leaf's gradient as backward adds it, while alive on this thread (the
// innermost one): a general "gradient ready" hook, one term at a time. A lock-step check's record of
// each leaf's terms is one (verify/contribution_magnitudes.h); autograd knows nothing more of it.
class LeafGradientObserver {
 public:
  LeafGradientObserver();
  virtual ~LeafGradientObserver();
  LeafGradientObserver(const LeafGradientObserver&) = delete;
  LeafGradientObserver& operator=(const LeafGradientObserver&) = delete;
  static LeafGradientObserver* current();  // this thread's innermost, or null

  virtual void contributed(const Tensor& leaf, const Tensor& contribution) = 0;

 private:
  LeafGradientObserver* previous_;
};

// Gives `output` a node when grad mode is on and some input requires a gradient. `deferrable`: which
// inputs are weights whose gradients the rule can compute apart from the others (input_wanted).
Tensor record(Tensor output, std::string name, std::vector<Tensor> inputs, BackwardFn backward,
              std::vector<bool> deferrable = {});

// Inside an op's backward rule: whether the gradient of input i is wanted from this call. Always, but
// in the two halves of a split backward (backward_deferring_weights), which each want some.
bool input_wanted(std::size_t i);

// Backpropagates from `root`. With no `grad_output` the root must be a one-element loss (its gradient
// is 1); a pipeline stage instead passes the gradient of its output, received from the next stage.
// Leaf gradients accumulate (+=) into .grad; each leaf's post-accumulate hooks fire as soon as its
// last contribution of this pass has been added, which is what lets DDP start communicating a
// bucket while backward is still running (chapter 05). The graph is freed afterwards, then the
// callbacks queued during this pass run, in the order they were queued.
void backward(const Tensor& root, const Tensor& grad_output = Tensor());

// Zero-bubble pipelining (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024) splits a backward
// pass in two: B, the gradients of the activations, which the stage before waits for, and W, the
// gradients of the weights, which nothing waits for, so a schedule can put them where the pipeline
// would idle. backward_deferring_weights runs B: an op that can split (linear's weight and bias,
// matmul's second operand) computes now only the gradients of its inputs that are not parameters (nor a
// parameter's autocast copy), and leaves the rest as work in the returned object; run() is W. The same
// rules on the same values, each parameter's contributions added in the order B reached them: the
// gradients are bit-identical to one backward. A parameter's hooks fire when W adds its gradient.
class DeferredWeightGradients {
 public:
  void run();  // W: computes and adds every deferred gradient, then forgets them
  bool empty() const { return work_.empty(); }

 private:
  friend DeferredWeightGradients backward_deferring_weights(const Tensor&, const Tensor&);
  std::vector<std::function<void()>> work_;
};
DeferredWeightGradients backward_deferring_weights(const Tensor& root, const Tensor& grad_output = Tensor());

// A backward called from inside another's node (activation recomputation, common/autograd/checkpoint.h)
// is part of the outer pass: what it queues runs when the outer pass ends.
// Queues `callback` to run once the backward pass in progress has finished (PyTorch's
// Engine.queue_callback): how a hook learns that backward is over without counting gradients.
// Callable only from inside backward (from a hook); throws std::logic_error elsewhere.
void queue_callback(std::function<void()> callback);

}  // namespace autograd
}  // namespace course
