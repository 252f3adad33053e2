// The TP ranks' parts on threads, and their gradients put together.
#include "common/verify/tensor_parallel_reference.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <stdexcept>

#include "common/autograd/autograd.h"
#include "common/core/memory.h"
#include "common/parallel/whole_model.h"

namespace course::verify {

TensorParallelReference::TensorParallelReference(int tp, const Make& make, const nn::Module& whole,
                                                 bool sequence_parallel)
    : group_(tp), parts_(static_cast<std::size_t>(tp)), sequence_parallel_(sequence_parallel) {
  MemoryCategoryOverride verification(MemoryCategory::verification);
  group_.run([&](comm::Communicator& member) {
    MemoryCategoryOverride counted(MemoryCategory::verification);
    parts_[static_cast<std::size_t>(member.rank())] = make(member);
  });
  std::vector<std::map<std::string, Tensor>> named(parts_.size());
  for (std::size_t t = 0; t < parts_.size(); ++t)
    for (const auto& [name, p] : parts_[t]->named_parameters()) named[t][name] = p;
  for (const auto& [name, p] : whole.named_parameters()) {
    Slot slot{name, p, {}, parts_.front()->is_split(name), {}};
    for (std::size_t t = 0; t < parts_.size(); ++t) {
      const auto found = named[t].find(name);
      if (found == named[t].end())
        throw std::invalid_argument("TensorParallelReference: TP rank " + std::to_string(t) + "'s part has no '" + name + "'");
      slot.parts.push_back(found->second);
      if (slot.split) slot.places.push_back(parallel::places_in_whole(*parts_[t], name, p.shape(), p.device()));
    }
    slots_.push_back(std::move(slot));
  }
}

float TensorParallelReference::backward(nn::Module& whole, const Backward& backward) {
  MemoryCategoryOverride verification(MemoryCategory::verification);
  const auto whole_parameters = whole.parameters();
  if (whole_parameters.size() != slots_.size())
    throw std::invalid_argument("TensorParallelReference: the whole model is not the one the parts were made from");
  {
    autograd::NoGradGuard no_grad;
    for (std::size_t s = 0; s < slots_.size(); ++s)
      for (std::size_t t = 0; t < parts_.size(); ++t) {
        Slot& slot = slots_[s];
        slot.parts[t].copy_from(slot.split ? parts_[t]->part_of(slot.name, whole_parameters[s]) : whole_parameters[s]);
      }
  }
  for (auto& part : parts_) part->zero_grad();
  // Each rank's loss, and the magnitudes and counts of the terms each of its parameters received.
  std::vector<float> losses(parts_.size());
  std::vector<std::vector<std::vector<double>>> magnitudes(parts_.size(), std::vector<std::vector<double>>(slots_.size()));
  std::vector<std::vector<int>> counts(parts_.size(), std::vector<int>(slots_.size(), 0));
  group_.run([&](comm::Communicator& member) {
    MemoryCategoryOverride counted(MemoryCategory::verification);
    const auto t = static_cast<std::size_t>(member.rank());
    autograd::ContributionMagnitudes terms;
    losses[t] = backward(*parts_[t]);
    parallel::finish_gradients(*parts_[t]);
    for (std::size_t s = 0; s < slots_.size(); ++s) {
      const Tensor& p = slots_[s].parts[t];
      if (const auto* recorded = terms.of(p)) magnitudes[t][s] = *recorded;
      counts[t][s] = terms.count(p);
    }
  });
  autograd::ContributionMagnitudes* caller = autograd::ContributionMagnitudes::current();
  for (std::size_t s = 0; s < slots_.size(); ++s) {
    const Slot& slot = slots_[s];
    Tensor p = whole_parameters[s];
    const auto n = static_cast<std::size_t>(p.numel());
    std::vector<float> gradient(n, 0.0f);
    std::vector<double> magnitude(n, 0.0);
    int count = 0;
    // The ranks whose terms this parameter's gradient holds: each its own elements when split; all of
    // them for an unsplit one under sequence parallelism (summed by finish_gradients); else the first,
    // whose copy every rank's equals.
    const std::size_t contributing = slot.split || sequence_parallel_ ? parts_.size() : 1;
    for (std::size_t t = 0; t < contributing; ++t) {
      const Tensor g = slot.parts[t].grad();
      const std::vector<double>& m = magnitudes[t][s];
      if (slot.split) {
        const auto& places = slot.places[t];
        if (g.defined()) {
          const auto values = g.to_host();
          for (std::size_t j = 0; j < values.size(); ++j) gradient[static_cast<std::size_t>(places[j])] = values[j];
        }
        for (std::size_t j = 0; j < m.size(); ++j) magnitude[static_cast<std::size_t>(places[j])] = m[j];
        count = std::max(count, counts[t][s]);
      } else {
        if (t == 0 && g.defined()) gradient = g.to_host();
        for (std::size_t j = 0; j < m.size(); ++j) magnitude[j] += m[j];
        count += counts[t][s];
      }
    }
    const Tensor values = Tensor::from_host(gradient, p.shape(), p.device());
    if (p.grad().defined())
      p.grad().copy_from(values);
    else
      p.set_grad(values);
    if (caller && count > 0) caller->add(p, magnitude, count);
  }
  return losses.front();
}

}  // namespace course::verify
