// The backward engine: topological order, gradient accumulation, grad-ready hooks.
#include "common/autograd/autograd.h"

#include <stdexcept>
#include <unordered_map>
#include <unordered_set>

#include "common/kernels/kernels.h"

namespace course::autograd {
namespace {

thread_local bool t_grad_enabled = true;

void accumulate(Tensor& target, const Tensor& contribution) {
  kernels(target.device()).binary(BinaryOp::add, target.data(), static_cast<std::size_t>(target.numel()),
                                  contribution.data(), static_cast<std::size_t>(contribution.numel()),
                                  target.data(), static_cast<std::size_t>(target.numel()));
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

void backward(const Tensor& root) {
  if (!root.defined() || root.numel() != 1)
    throw std::invalid_argument("backward() needs a one-element tensor (a loss)");
  if (!root.requires_grad()) throw std::invalid_argument("backward(): the loss does not depend on any parameter");
  NoGradGuard no_grad;

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
      MemoryCategoryScope scope(MemoryCategory::gradients);
      impl->grad = Tensor::zeros(leaf.shape(), leaf.device()).impl_ptr();
    }
    Tensor grad(impl->grad);
    if (g.defined()) accumulate(grad, g);
  };

  std::unordered_map<TensorImpl*, Tensor> grads;
  grads[root.impl()] = Tensor::ones(root.shape(), root.device());
  if (order.empty()) {  // the root is itself a leaf
    add_to_leaf(root, grads[root.impl()]);
    for (auto& hook : root.impl()->grad_ready_hooks) {
      Tensor grad(root.impl()->grad);
      hook(grad);
    }
    return;
  }

  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    TensorImpl* t = *it;
    Tensor grad_output = grads[t];
    grads.erase(t);
    Node& node = *t->grad_fn;
    std::vector<Tensor> input_grads = node.backward(grad_output);
    if (input_grads.size() != node.inputs.size())
      throw std::logic_error("backward of " + node.name + " returned the wrong number of gradients");
    for (std::size_t i = 0; i < node.inputs.size(); ++i) {
      const Tensor& input = node.inputs[i];
      if (!input.requires_grad()) continue;
      const Tensor& g = input_grads[i];
      if (input.impl()->grad_fn) {
        if (!g.defined()) continue;
        auto found = grads.find(input.impl());
        if (found == grads.end()) grads.emplace(input.impl(), g.clone());
        else accumulate(found->second, g);
      } else {
        add_to_leaf(input, g);
        if (--pending[input.impl()] == 0) {
          Tensor leaf_grad(input.impl()->grad);
          for (auto& hook : input.impl()->grad_ready_hooks) hook(leaf_grad);
        }
      }
    }
  }
  for (TensorImpl* t : order) t->grad_fn.reset();  // free the graph and the tensors it saved
}

}  // namespace course::autograd
