// The backward engine: topological order, gradient accumulation, grad-ready hooks.
#include "common/autograd/autograd.h"
#include "common/ops/autocast.h"

#include <algorithm>
#include <cmath>
#include <optional>
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

// The inputs a backward rule is asked for (null: all), set around the call of a split node's rule.
thread_local const std::vector<bool>* t_wanted = nullptr;

std::vector<Tensor> call_rule(Node& node, const Tensor& grad_output, const std::vector<bool>* wanted) {
  const std::vector<bool>* previous = t_wanted;
  t_wanted = wanted;
  std::vector<Tensor> grads;
  try {
    profiler::RecordFunction timed(node.name.c_str(), true);
    grads = node.backward(grad_output);
  } catch (...) {
    t_wanted = previous;
    throw;
  }
  t_wanted = previous;
  if (grads.size() != node.inputs.size())
    throw std::logic_error("backward of " + node.name + " returned the wrong number of gradients");
  return grads;
}

void fire_hooks(const Tensor& leaf) {
  Tensor parameter = leaf;
  for (auto& hook : leaf.impl()->post_accumulate_grad_hooks) hook(parameter);
}

Tensor sum_of(const Tensor& a, const Tensor& b) {
  Tensor out = a.clone();
  out.add_(b);  // in float32, rounded once to a's type: as PyTorch adds two bfloat16 gradients
  return out;
}

// Post-order depth-first walk over the nodes; reversed it is a valid processing order, since every
// node then comes after all the nodes that used its output. The order owns the nodes for the pass: a
// node processed drops its edges, which may hold the only reference to a node still to come.
void topological_order(const std::shared_ptr<Node>& root, std::vector<std::shared_ptr<Node>>& order) {
  std::unordered_set<Node*> visited;
  std::vector<std::pair<std::shared_ptr<Node>, std::size_t>> stack{{root, 0}};
  visited.insert(root.get());
  while (!stack.empty()) {
    auto& [node, next_input] = stack.back();
    if (next_input < node->inputs.size()) {
      const std::shared_ptr<Node>& input = node->inputs[next_input++].producer;
      if (input && visited.insert(input.get()).second) stack.push_back({input, 0});
    } else {
      order.push_back(std::move(node));
      stack.pop_back();
    }
  }
}

}  // namespace

thread_local LeafGradientObserver* t_observer = nullptr;

namespace {

// A leaf's gradient accumulates (+=): a 16-bit gradient is added in float32 and rounded once.
void add_to_leaf(const Tensor& leaf, const Tensor& g) {
  TensorImpl* impl = leaf.impl();
  if (!impl->grad) {
    MemoryCategoryScope scope(impl->grad_category);
    impl->grad = Tensor::zeros(leaf.shape(), leaf.device(), leaf.dtype()).impl_ptr();
  }
  Tensor grad(impl->grad);
  if (g.defined()) grad.add_(g);
  if (g.defined() && t_observer) t_observer->contributed(leaf, g);
}

void run_backward(const Tensor& root, const Tensor& grad_output, std::vector<std::function<void()>>* deferred);

}  // namespace

bool input_wanted(std::size_t i) { return !t_wanted || (i < t_wanted->size() && (*t_wanted)[i]); }

void DeferredWeightGradients::run() {
  NoGradGuard no_grad;
  Autocast no_autocast(DType::float32, false);
  auto work = std::move(work_);
  work_.clear();
  for (auto& w : work) w();
}

DeferredWeightGradients backward_deferring_weights(const Tensor& root, const Tensor& grad_output) {
  DeferredWeightGradients out;
  run_backward(root, grad_output, &out.work_);
  return out;
}

LeafGradientObserver::LeafGradientObserver() : previous_(t_observer) { t_observer = this; }
LeafGradientObserver::~LeafGradientObserver() { t_observer = previous_; }
LeafGradientObserver* LeafGradientObserver::current() { return t_observer; }

bool grad_enabled() { return t_grad_enabled; }
NoGradGuard::NoGradGuard() : previous_(t_grad_enabled) { t_grad_enabled = false; }
NoGradGuard::~NoGradGuard() { t_grad_enabled = previous_; }
EnableGradGuard::EnableGradGuard() : previous_(t_grad_enabled) { t_grad_enabled = true; }
EnableGradGuard::~EnableGradGuard() { t_grad_enabled = previous_; }

Tensor record(Tensor output, std::string name, std::vector<Tensor> inputs, BackwardFn backward,
              std::vector<bool> deferrable) {
  if (!t_grad_enabled) return output;
  bool any = false;
  for (const auto& input : inputs) any = any || input.requires_grad();
  if (!any) return output;
  auto node = std::make_shared<Node>();
  node->name = std::move(name);
  node->inputs.reserve(inputs.size());
  for (auto& input : inputs) {
    Edge edge;
    edge.producer = input.impl()->grad_fn;
    edge.dtype = input.dtype();
    edge.requires_grad = input.requires_grad();
    if (edge.requires_grad && !edge.producer) edge.leaf = std::move(input);
    node->inputs.push_back(std::move(edge));
  }
  node->backward = std::move(backward);
  node->deferrable = std::move(deferrable);
  output.impl()->grad_fn = std::move(node);
  output.impl()->requires_grad = true;
  return output;
}

void queue_callback(std::function<void()> callback) {
  if (!t_callbacks) throw std::logic_error("queue_callback: no backward pass is running");
  t_callbacks->push_back(std::move(callback));
}

void backward(const Tensor& root, const Tensor& grad_output) { run_backward(root, grad_output, nullptr); }

namespace {

// The parameter behind input `e` of a splitting node, if its gradient may wait: the parameter itself,
// or its autocast copy (a cast of a parameter that nothing else reads, so the cast's own rule can wait
// with it). Null otherwise.
TensorImpl* weight_behind(const Edge& e, const std::unordered_map<Node*, int>& consumers) {
  if (!e.requires_grad) return nullptr;
  if (e.leaf.defined()) return e.leaf.impl();
  const Node* p = e.producer.get();
  const auto used = consumers.find(e.producer.get());
  const bool cast_of_parameter = p && p->name == "cast" && p->inputs.size() == 1 && p->inputs[0].leaf.defined() &&
                                 used != consumers.end() && used->second == 1;
  return cast_of_parameter ? p->inputs[0].leaf.impl() : nullptr;
}

void run_backward(const Tensor& root, const Tensor& grad_output, std::vector<std::function<void()>>* deferred) {
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
  std::optional<CallbackQueue> callbacks;  // a backward inside another's node queues into the outer pass's
  if (!t_callbacks) callbacks.emplace();

  std::vector<std::shared_ptr<Node>> order;
  if (root.impl()->grad_fn) topological_order(root.impl()->grad_fn, order);

  // How many contributions each leaf will receive in this pass; its hooks fire when the count hits 0.
  // And how many nodes read each node's output (a split backward defers only a cast read once).
  std::unordered_map<TensorImpl*, int> pending;
  std::unordered_map<Node*, int> consumers;
  for (const auto& node : order)
    for (const Edge& input : node->inputs) {
      if (input.leaf.defined()) ++pending[input.leaf.impl()];
      if (input.producer) ++consumers[input.producer.get()];
    }
  // A split backward defers a parameter's gradient only where every contribution it gets in this pass
  // can wait (a table tied to the head and read by the embedding gets one in B: it waits for none), so
  // each parameter's contributions are still added in one backward's order.
  std::unordered_map<TensorImpl*, int> deferrable;
  const std::unordered_map<TensorImpl*, int> contributions = pending;  // pending counts down as the pass goes
  if (deferred)
    for (const auto& node : order)
      for (std::size_t i = 0; i < node->inputs.size() && i < node->deferrable.size(); ++i)
        if (node->deferrable[i])
          if (TensorImpl* weight = weight_behind(node->inputs[i], consumers)) ++deferrable[weight];
  const auto waits = [&](const Edge& e) {
    TensorImpl* weight = weight_behind(e, consumers);
    return weight && deferrable[weight] == contributions.at(weight);
  };

  if (order.empty()) {  // the root is itself a leaf
    add_to_leaf(root, grad_output.defined() ? grad_output.to(root.dtype())
                                            : Tensor::ones(root.shape(), root.device(), root.dtype()));
    fire_hooks(root);
    if (callbacks) callbacks->run();
    return;
  }
  // The gradient of each node's output, keyed by the node (one output each).
  std::unordered_map<Node*, Tensor> grads;
  grads[order.back().get()] = grad_output.defined() ? grad_output.to(root.dtype())
                                              : Tensor::ones(root.shape(), root.device(), root.dtype());
  std::unordered_set<Node*> waiting;  // casts whose rule runs with a deferred weight's, in W

  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    Node& node = **it;
    Tensor grad_output = grads[&node];
    grads.erase(&node);
    if (!grad_output.defined()) {  // nothing reached it now: a weight's cast, whose gradient comes in W
      if (!waiting.count(&node)) node.backward = nullptr, node.inputs.clear();
      continue;
    }
    if (!node.backward)
      throw std::logic_error("backward through " + node.name + " a second time: its graph was freed by the first backward");
    // A split backward: the weights' gradients of a node that can split them wait for W.
    std::vector<bool> now(node.inputs.size(), true), later(node.inputs.size(), false);
    bool splits = false;
    if (deferred && !node.deferrable.empty())
      for (std::size_t i = 0; i < node.inputs.size(); ++i)
        if (i < node.deferrable.size() && node.deferrable[i] && waits(node.inputs[i]))
          now[i] = false, later[i] = true, splits = true;
    const std::vector<Tensor> input_grads = call_rule(node, grad_output, splits ? &now : nullptr);
    for (std::size_t i = 0; i < node.inputs.size(); ++i) {
      const Edge& input = node.inputs[i];
      if (!input.requires_grad || !now[i]) continue;
      // A gradient has its tensor's type, whatever type the rule computed it in (PyTorch's engine casts
      // likewise): the float32 gradient of a bfloat16 activation is rounded to bfloat16 here.
      const Tensor g = input_grads[i].defined() ? input_grads[i].to(input.dtype) : input_grads[i];
      if (input.producer) {
        if (!g.defined()) continue;
        // The first contribution is kept as it is (no copy); later ones make a new sum, so a gradient
        // that an op handed to several inputs (add gives the same tensor to both) is never written to.
        auto found = grads.find(input.producer.get());
        if (found == grads.end()) grads.emplace(input.producer.get(), g);
        else found->second = sum_of(found->second, g);
      } else {
        add_to_leaf(input.leaf, g);
        if (--pending[input.leaf.impl()] == 0) fire_hooks(input.leaf);
      }
    }
    if (splits) {
      // W: this node's rule again for its weights (its saved tensors live until then), and through a
      // weight's cast back to the parameter.
      for (std::size_t i = 0; i < node.inputs.size(); ++i)
        if (later[i] && node.inputs[i].producer) waiting.insert(node.inputs[i].producer.get());
      deferred->push_back([kept = *it, grad_output, later]() {
        const std::vector<Tensor> weight_grads = call_rule(*kept, grad_output, &later);
        for (std::size_t i = 0; i < kept->inputs.size(); ++i) {
          if (!later[i] || !weight_grads[i].defined()) continue;
          const Edge& input = kept->inputs[i];
          Tensor g = weight_grads[i].to(input.dtype);
          Tensor leaf = input.leaf;
          if (input.producer) {  // the cast's rule: the gradient in the parameter's type
            Node& cast = *input.producer;
            leaf = cast.inputs[0].leaf;
            g = call_rule(cast, g, nullptr)[0].to(cast.inputs[0].dtype);
            cast.backward = nullptr, cast.inputs.clear();
          }
          add_to_leaf(leaf, g);
          fire_hooks(leaf);
        }
        kept->backward = nullptr, kept->inputs.clear();
      });
      continue;
    }
    // Done with this node: the tensors its closure saved are freed now, not at the end of the pass,
    // so backward's memory falls as it goes (PyTorch frees each node's saved tensors likewise, unless
    // retain_graph). A tensor that outlives the graph keeps an empty node; a second backward through
    // it says so.
    node.backward = nullptr;
    node.inputs.clear();
  }
  if (callbacks) callbacks->run();
}

}  // namespace

}  // namespace course::autograd
