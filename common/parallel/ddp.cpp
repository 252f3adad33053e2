// DistributedDataParallel: broadcast at start, gradient averaging when backward completes.
#include "common/parallel/ddp.h"

#include <chrono>
#include <stdexcept>

#include "common/autograd/autograd.h"
#include "common/parallel/replicas.h"

namespace course::parallel {

DistributedDataParallel::DistributedDataParallel(std::shared_ptr<nn::Module> module, comm::Communicator& group)
    : module_(std::move(module)), comm_(group) {
  for (auto& [name, p] : module_->named_parameters()) {
    names_.push_back(name);
    parameters_.push_back(p);
  }
  ready_.assign(parameters_.size(), false);
  comm_hook_ = [](comm::Communicator& g, Tensor& gradient) { g.all_reduce(gradient, comm::ReduceOp::average); };
  // Step 1: everyone starts from rank 0's parameters, in registration order.
  for (auto& p : parameters_) comm_.broadcast(p, 0);
  // Step 3 is triggered from the gradient-ready hooks, which name the parameter that is ready.
  for (std::size_t i = 0; i < parameters_.size(); ++i)
    parameters_[i].register_post_accumulate_grad_hook([this, i](Tensor&) { on_gradient_ready(i); });
}

Tensor DistributedDataParallel::forward(const Tensor& x) { return (*module_)(x); }

void DistributedDataParallel::on_gradient_ready(std::size_t index) {
  ready_[index] = true;
  if (pass_started_) return;
  pass_started_ = true;
  autograd::queue_callback([this] { finish_backward(); });
}

void DistributedDataParallel::finish_backward() {
  std::vector<bool> ready(parameters_.size(), false);
  ready.swap(ready_);
  pass_started_ = false;
  for (std::size_t i = 0; i < ready.size(); ++i)
    if (!ready[i])
      // Every rank must all-reduce the same gradients in the same order, so a parameter that took no
      // part in this loss would leave the ranks disagreeing about the next collective.
      throw std::logic_error("DistributedDataParallel: parameter '" + names_[i] +
                             "' received no gradient in this backward pass; every parameter must take part "
                             "in the loss");
  if (sync_enabled_) synchronise_gradients();
}

void DistributedDataParallel::synchronise_gradients() {
  auto begin = std::chrono::steady_clock::now();
  for (auto& p : parameters_) {
    Tensor g = p.grad();
    comm_hook_(comm_, g);
  }
  communication_ms_ += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - begin).count();
  ++synchronisations_;
}

double DistributedDataParallel::take_communication_ms() {
  double ms = communication_ms_;
  communication_ms_ = 0;
  return ms;
}

bool DistributedDataParallel::parameters_identical() { return parallel::parameters_identical(comm_, parameters_); }

}  // namespace course::parallel
