// DistributedDataParallel: broadcast at start, gradient averaging when backward completes.
#include "common/parallel/ddp.h"

#include <chrono>
#include <cstring>
#include <stdexcept>

#include "common/autograd/autograd.h"

namespace course::parallel {

DistributedDataParallel::DistributedDataParallel(std::shared_ptr<nn::Module> module, comm::Communicator& comm)
    : module_(std::move(module)), comm_(comm), parameters_(module_->parameters()) {
  // Step 1: everyone starts from rank 0's parameters, in registration order.
  for (auto& p : parameters_) comm_.broadcast(p, 0);
  // Step 3 is triggered by the grad-ready hooks: when the last one fires, backward is done.
  for (auto& p : parameters_) p.register_grad_ready_hook([this](Tensor&) { on_gradient_ready(); });
}

Tensor DistributedDataParallel::forward(const Tensor& x) {
  if (ready_ != 0)
    throw std::logic_error("DistributedDataParallel: the last backward pass gave gradients to only " +
                           std::to_string(ready_) + " of " + std::to_string(parameters_.size()) +
                           " parameters; every parameter must take part in the loss");
  return (*module_)(x);
}

void DistributedDataParallel::on_gradient_ready() {
  if (++ready_ < parameters_.size()) return;
  ready_ = 0;
  if (sync_enabled_) synchronise_gradients();
}

void DistributedDataParallel::synchronise_gradients() {
  auto begin = std::chrono::steady_clock::now();
  for (auto& p : parameters_) {
    Tensor g = p.grad();
    comm_.all_reduce(g, comm::ReduceOp::average);
  }
  communication_ms_ += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - begin).count();
  ++synchronisations_;
}

double DistributedDataParallel::take_communication_ms() {
  double ms = communication_ms_;
  communication_ms_ = 0;
  return ms;
}

std::uint64_t DistributedDataParallel::parameter_checksum() const {
  // FNV-1a over the parameters' bytes: any differing bit changes it.
  std::uint64_t hash = 0xcbf29ce484222325ULL;
  for (const auto& p : parameters_) {
    auto values = p.to_host();
    const auto* bytes = reinterpret_cast<const unsigned char*>(values.data());
    for (std::size_t i = 0; i < values.size() * sizeof(float); ++i) hash = (hash ^ bytes[i]) * 0x100000001b3ULL;
  }
  return hash;
}

bool DistributedDataParallel::parameters_identical() {
  // The 64-bit checksum travels as four 16-bit pieces, each exact in a float.
  std::uint64_t mine = parameter_checksum();
  std::vector<float> pieces(4);
  for (int i = 0; i < 4; ++i) pieces[static_cast<std::size_t>(i)] = static_cast<float>((mine >> (16 * i)) & 0xFFFF);
  Tensor local = Tensor::from_host(pieces, {4});
  Tensor all = Tensor::zeros({4 * comm_.size()});
  comm_.all_gather(local, all);
  auto values = all.to_host();
  for (std::size_t i = 0; i < values.size(); ++i)
    if (values[i] != pieces[i % 4]) return false;
  return true;
}

void on_rank0(comm::Communicator& comm, const std::function<void()>& work, bool wait) {
  if (comm.rank() == 0) work();
  if (wait) comm.barrier();
}

}  // namespace course::parallel
