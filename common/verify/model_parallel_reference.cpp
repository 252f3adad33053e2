// The ranks' parts on threads, and one context-parallel rank's gradients put together.
#include "common/verify/model_parallel_reference.h"

#include <algorithm>
#include <map>
#include <optional>
#include <stdexcept>

#include "common/autograd/autograd.h"
#include "common/core/memory.h"
#include "common/ops/autocast.h"
#include "common/verify/whole_model.h"
#include "common/verify/contribution_magnitudes.h"

namespace course::verify {

ModelParallelReference::ModelParallelReference(int tp, int cp, parallel::ContextMethod method, const Make& make,
                                               const nn::Module& whole, bool sequence_parallel)
    : tp_(tp), cp_(cp), turns_(verify::make_turns()), sequence_parallel_(sequence_parallel) {
  MemoryCategoryOverride verification(MemoryCategory::verification);
  // Thread c tp + t: TP rank t of CP rank c, a member of TP group c and of CP group t.
  for (int c = 0; c < cp; ++c) tp_groups_.push_back(std::make_unique<verify::LocalGroup>(tp, turns_));
  for (int t = 0; t < tp; ++t) cp_groups_.push_back(std::make_unique<verify::LocalGroup>(cp, turns_));
  const auto threads = static_cast<std::size_t>(tp * cp);
  parts_.resize(threads);
  attention_.resize(threads);
  verify::run_in_turns(*turns_, tp * cp, [&](int k) {
    MemoryCategoryOverride counted(MemoryCategory::verification);
    const int t = k % tp, c = k / tp;
    const auto at = static_cast<std::size_t>(k);
    if (cp > 1) attention_[at] = std::make_unique<parallel::ContextParallel>(cp_groups_[static_cast<std::size_t>(t)]->member(c), method);
    parts_[at] = make(tp_groups_[static_cast<std::size_t>(c)]->member(t), attention_[at].get());
  });
  std::vector<std::map<std::string, Tensor>> named(threads);
  for (std::size_t k = 0; k < threads; ++k)
    for (const auto& [name, p] : parts_[k]->named_parameters()) named[k][name] = p;
  for (const auto& [name, p] : whole.named_parameters()) {
    Slot slot{name, parts_.front()->is_split(name), {}, {}};
    for (std::size_t k = 0; k < threads; ++k) {
      const auto found = named[k].find(name);
      if (found == named[k].end())
        throw std::invalid_argument("ModelParallelReference: rank " + std::to_string(k) + "'s part has no '" + name + "'");
      slot.parts.push_back(found->second);
      if (slot.split && k < static_cast<std::size_t>(tp))  // the same places at every CP rank
        slot.places.push_back(verify::places_in_whole(*parts_[k], name, p.shape(), p.device()));
    }
    slots_.push_back(std::move(slot));
  }
}

float ModelParallelReference::backward(nn::Module& whole, const Backward& backward, int cp_rank) {
  MemoryCategoryOverride verification(MemoryCategory::verification);
  const auto whole_parameters = whole.parameters();
  if (whole_parameters.size() != slots_.size())
    throw std::invalid_argument("ModelParallelReference: the whole model is not the one the parts were made from");
  if (cp_rank < 0 || cp_rank >= cp_) throw std::invalid_argument("ModelParallelReference: no CP rank " + std::to_string(cp_rank));
  const std::size_t threads = parts_.size();
  {
    autograd::NoGradGuard no_grad;
    for (std::size_t s = 0; s < slots_.size(); ++s)
      for (std::size_t k = 0; k < threads; ++k) {
        Slot& slot = slots_[s];
        slot.parts[k].copy_from(slot.split ? parts_[k]->part_of(slot.name, whole_parameters[s]) : whole_parameters[s]);
      }
  }
  for (auto& part : parts_) part->zero_grad();
  // Each thread's loss, and the magnitudes and counts of the terms each of its parameters received.
  std::vector<float> losses(threads);
  std::vector<std::vector<std::vector<double>>> magnitudes(threads, std::vector<std::vector<double>>(slots_.size()));
  std::vector<std::vector<int>> counts(threads, std::vector<int>(slots_.size(), 0));
  const EmulatedSixteenBits* emulation = EmulatedSixteenBits::current();  // the caller's, on every thread
  verify::run_in_turns(*turns_, static_cast<int>(threads), [&](int thread) {
    MemoryCategoryOverride counted(MemoryCategory::verification);
    std::optional<EmulatedSixteenBits> emulated;
    if (emulation) emulated.emplace(emulation->perturbation());
    const auto k = static_cast<std::size_t>(thread);
    verify::ContributionMagnitudes terms;
    losses[k] = backward(*parts_[k]);
    parallel::finish_gradients(*parts_[k]);
    for (std::size_t s = 0; s < slots_.size(); ++s) {
      const Tensor& p = slots_[s].parts[k];
      if (const auto* recorded = terms.of(p)) magnitudes[k][s] = *recorded;
      counts[k][s] = terms.count(p);
    }
  });
  verify::ContributionMagnitudes* caller = verify::ContributionMagnitudes::current();
  const auto first = static_cast<std::size_t>(cp_rank * tp_);  // TP rank 0 of this CP rank
  for (std::size_t s = 0; s < slots_.size(); ++s) {
    const Slot& slot = slots_[s];
    Tensor p = whole_parameters[s];
    const auto n = static_cast<std::size_t>(p.numel());
    std::vector<float> gradient(n, 0.0f);
    std::vector<double> magnitude(n, 0.0);
    int count = 0;
    // The TP ranks whose terms this parameter's gradient holds: each its own elements when split; all of
    // them for an unsplit one under sequence parallelism (summed by finish_gradients); else the first,
    // whose copy every TP rank's equals.
    const std::size_t contributing = slot.split || sequence_parallel_ ? static_cast<std::size_t>(tp_) : 1;
    for (std::size_t t = 0; t < contributing; ++t) {
      const Tensor g = slot.parts[first + t].grad();
      const std::vector<double>& m = magnitudes[first + t][s];
      if (slot.split) {
        const auto& places = slot.places[t];
        if (g.defined()) {
          const auto values = g.to_host();
          for (std::size_t j = 0; j < values.size(); ++j) gradient[static_cast<std::size_t>(places[j])] = values[j];
        }
        for (std::size_t j = 0; j < m.size(); ++j) magnitude[static_cast<std::size_t>(places[j])] = m[j];
        count = std::max(count, counts[first + t][s]);
      } else {
        if (t == 0 && g.defined()) gradient = g.to_host();
        for (std::size_t j = 0; j < m.size(); ++j) magnitude[j] += m[j];
        count += counts[first + t][s];
      }
    }
    const Tensor values = Tensor::from_host(gradient, p.shape(), p.device());
    if (p.grad().defined())
      p.grad().copy_from(values);
    else
      p.set_grad(values);
    if (caller && count > 0) caller->add(p, magnitude, count);
  }
  return losses[first];
}

}  // namespace course::verify
