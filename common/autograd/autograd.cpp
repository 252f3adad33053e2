// The backward engine: topological order, gradient accumulation, grad-ready hooks.
#include "common/autograd/autograd.h"
#include "common/ops/autocast.h"

#include <stdexcept>
#include <unordered_map>
#include <unordered_set>

#include "common/autograd/profiler.h"
#include "common/kernels/kernels.h"

namespace course::autograd {
namespace {

thread_local bool t_grad_enabled = true;
thread_local std::vector<std::function<void()>>* t_callbacks = nullptr;  // set while a backward runs

// Makes the queue for one backward pass, and runs what was queued when the pass ends.
class CallbackQueue {
 public:
  CallbackQueue() : previous_(t_callbacks) { t_callbacks = &queued_; }
  ~CallbackQueue() { t_callbacks = previous_; }
  CallbackQueue(const CallbackQueue&) = delete;
  CallbackQueue& operator=(const CallbackQueue&) = delete;
  void run() {
    t_callbacks = previous_;  // a callback may itself run a backward pass
    for (std::size_t i = 0; i < queued_.size(); ++i) queued_[i]();
  }

 private:
  std::vector<std::function<void()>> queued_;
  std::vector<std::function<void()>>* previous_;
};

void fire_hooks(const Tensor& leaf) {
  Tensor parameter = leaf;
  for (auto& hook : leaf.impl()->post_accumulate_grad_hooks) hook(parameter);
}

Tensor sum_of(const Tensor& a, const Tensor& b) {
  Tensor out = a.to(DType::float32).clone();
  out.add_(b);  // in float32, rounded once: as PyTorch adds two bfloat16 gradients
  return out.to(a.dtype());
}

// Post-order depth-first walk over the tensors that have a grad_fn; reversed it is a valid
// processing order, since every tensor then comes after all the tensors computed from it.
void topological_order(TensorImpl* root, std::vector<TensorImpl*>& order) {
  std::unordered_set<TensorImpl*> visited;
  std::vector<std::pair<TensorImpl*, std::size_t>> stack{{root, 0}};
  visited.insert(root);
  while (!stack.empty()) {
    auto& [tensor, next_input] = stack.back();
    const auto& inputs = tensor->grad_fn->inputs;
    if (next_input < inputs.size()) {
      TensorImpl* input = inputs[next_input++].impl();
      if (input->grad_fn && visited.insert(input).second) stack.push_back({input, 0});
    } else {
      order.push_back(tensor);
      stack.pop_back();
    }
  }
}

}  // namespace

bool grad_enabled() { return t_grad_enabled; }
NoGradGuard::NoGradGuard() : previous_(t_grad_enabled) { t_grad_enabled = false; }
NoGradGuard::~NoGradGuard() { t_grad_enabled = previous_; }

Tensor record(Tensor output, std::string name, std::vector<Tensor> inputs, BackwardFn backward) {
  if (!t_grad_enabled) return output;
  bool any = false;
  for (const auto& input : inputs) any = any || input.requires_grad();
  if (!any) return output;
  auto node = std::make_shared<Node>();
  node->name = std::move(name);
  node->inputs = std::move(inputs);
  node->backward = std::move(backward);
  output.impl()->grad_fn = std::move(node);
  output.impl()->requires_grad = true;
  return output;
}

void queue_callback(std::function<void()> callback) {
  if (!t_callbacks) throw std::logic_error("queue_callback: no backward pass is running");
  t_callbacks->push_back(std::move(callback));
}

void backward(const Tensor& root, const Tensor& grad_output) {
  if (!root.defined()) throw std::invalid_argument("backward(): the output is an undefined tensor");
  if (!grad_output.defined() && root.numel() != 1)
    throw std::invalid_argument("backward() without a gradient needs a one-element tensor (a loss), got shape " +
                                shape_string(root.shape()));
  if (grad_output.defined() && (grad_output.shape() != root.shape() || grad_output.device() != root.device()))
    throw std::invalid_argument("backward(): the gradient has shape " + shape_string(grad_output.shape()) +
                                " but the output has shape " + shape_string(root.shape()));
  if (!root.requires_grad()) throw std::invalid_argument("backward(): the output does not depend on any parameter");
  NoGradGuard no_grad;
  // Each op's backward runs in the types its forward chose; autocast does not apply to it (PyTorch's
  // backward runs outside autocast too).
  Autocast no_autocast(DType::float32, false);
  CallbackQueue callbacks;

  std::vector<TensorImpl*> order;
  if (root.impl()->grad_fn) topological_order(root.impl(), order);

  // How many contributions each leaf will receive in this pass; its hooks fire when the count hits 0.
  std::unordered_map<TensorImpl*, int> pending;
  for (TensorImpl* t : order)
    for (const auto& input : t->grad_fn->inputs)
      if (input.requires_grad() && !input.impl()->grad_fn) ++pending[input.impl()];

  auto add_to_leaf = [&](const Tensor& leaf, const Tensor& g) {
    TensorImpl* impl = leaf.impl();
    if (!impl->grad) {
      MemoryCategoryScope scope(impl->grad_category);
      impl->grad = Tensor::zeros(leaf.shape(), leaf.device(), leaf.dtype()).impl_ptr();
    }
    Tensor grad(impl->grad);
    if (g.defined()) grad.add_(g);  // a 16-bit gradient: added in float32, rounded once
  };

  std::unordered_map<TensorImpl*, Tensor> grads;
  grads[root.impl()] = grad_output.defined() ? grad_output.to(root.dtype())
                                             : Tensor::ones(root.shape(), root.device(), root.dtype());
  if (order.empty()) {  // the root is itself a leaf
    add_to_leaf(root, grads[root.impl()]);
    fire_hooks(root);
    callbacks.run();
    return;
  }

  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    TensorImpl* t = *it;
    Tensor grad_output = grads[t];
    grads.erase(t);
    Node& node = *t->grad_fn;
    std::vector<Tensor> input_grads;
    {
      profiler::RecordFunction timed(node.name.c_str(), true);
      input_grads = node.backward(grad_output);
    }
    if (input_grads.size() != node.inputs.size())
      throw std::logic_error("backward of " + node.name + " returned the wrong number of gradients");
    for (std::size_t i = 0; i < node.inputs.size(); ++i) {
      const Tensor& input = node.inputs[i];
      if (!input.requires_grad()) continue;
      // A gradient has its tensor's type, whatever type the rule computed it in (PyTorch's engine casts
      // likewise): the float32 gradient of a bfloat16 activation is rounded to bfloat16 here.
      const Tensor g = input_grads[i].defined() ? input_grads[i].to(input.dtype()) : input_grads[i];
      if (input.impl()->grad_fn) {
        if (!g.defined()) continue;
        // The first contribution is kept as it is (no copy); later ones make a new sum, so a gradient
        // that an op handed to several inputs (add gives the same tensor to both) is never written to.
        auto found = grads.find(input.impl());
        if (found == grads.end()) grads.emplace(input.impl(), g);
        else found->second = sum_of(found->second, g);
      } else {
        add_to_leaf(input, g);
        if (--pending[input.impl()] == 0) fire_hooks(input);
      }
    }
  }
  for (TensorImpl* t : order) t->grad_fn.reset();  // free the graph and the tensors it saved
  callbacks.run();
}

}  // namespace course::autograd
