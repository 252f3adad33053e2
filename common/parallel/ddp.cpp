// DistributedDataParallel: broadcast at start, gradient averaging (through the Reducer) as backward runs.
#include "common/parallel/ddp.h"

#include <stdexcept>

#include "common/autograd/autograd.h"
#include "common/parallel/replicas.h"

namespace course::parallel {

DistributedDataParallel::DistributedDataParallel(std::shared_ptr<nn::Module> module, comm::Communicator& group,
                                                 ReducerOptions options)
    : module_(std::move(module)), comm_(group), parameters_(module_->parameters()),
      reducer_(module_->named_parameters(), group, options) {
  // Step 1: everyone starts from rank 0's parameters, in registration order.
  for (auto& p : parameters_) comm_.broadcast(p, 0);
  // Step 3 is driven by the gradient-ready hooks, which name the parameter that is ready.
  for (std::size_t i = 0; i < parameters_.size(); ++i)
    parameters_[i].register_post_accumulate_grad_hook([this, i](Tensor&) { on_gradient_ready(i); });
}

Tensor DistributedDataParallel::forward(const Tensor& x) { return (*module_)(x); }

void DistributedDataParallel::on_gradient_ready(std::size_t index) {
  reducer_.mark_ready(index, sync_enabled_);
  if (pass_started_) return;
  pass_started_ = true;
  autograd::queue_callback([this] { finish_backward(); });
}

void DistributedDataParallel::finish_backward() {
  pass_started_ = false;
  reducer_.finalize(sync_enabled_);
  if (sync_enabled_) ++synchronisations_;
}

bool DistributedDataParallel::parameters_identical() { return parallel::parameters_identical(comm_, parameters_); }

}  // namespace course::parallel
