// ZeRO stage 3: the parameters sharded too. Each unit (a wrapped module) keeps only this rank's part;
// it is all-gathered just before the unit's forward, freed after it, gathered again when backward
// reaches it and freed once its gradients are out; with prefetching the next unit's gather runs while
// this one computes.
#include <stdexcept>

#include "common/autograd/autograd.h"
#include "common/core/memory.h"
#include "common/nn/gpt.h"
#include "common/nn/layers.h"
#include "common/parallel/zero.h"
#include "common/parallel/zero_units.h"

namespace course::parallel {
namespace {

// An identity whose backward first runs `before`: ZeRO-3 marks a unit's output with it, so backward
// gathers the unit's parameters just before it reaches the unit's own operations.
Tensor run_before_backward(const Tensor& output, std::function<void()> before) {
  if (!autograd::grad_enabled() || !output.requires_grad()) return output;
  return autograd::record(output.detach(), "zero3_gather", {output}, [before](const Tensor& g) {
    before();
    return std::vector<Tensor>{g};
  });
}

}  // namespace

// The units (zero_units.h): the modules the policy wraps, outermost first, and the root unit.
WrappedUnits wrapped_units(nn::Module& model, const std::vector<Tensor>& params, const UnitPolicy& policy) {
  WrappedUnits out;
  std::vector<std::string> wrapped;
  std::vector<bool> taken(params.size(), false);
  for (auto& [name, module] : model.named_modules()) {
    if (name.empty()) continue;  // the model itself is the root
    bool inside = false;
    for (const auto& w : wrapped) inside = inside || name.rfind(w + ".", 0) == 0;
    if (inside || !policy(name, *module)) continue;
    wrapped.push_back(name);
    std::vector<std::size_t> unit;
    for (const Tensor& p : module->parameters())
      for (std::size_t i = 0; i < params.size(); ++i)
        if (params[i].impl() == p.impl() && !taken[i]) {
          unit.push_back(i);
          taken[i] = true;
        }
    if (unit.empty()) continue;
    out.units.push_back(unit);
    out.modules.push_back(module);
  }
  std::vector<std::size_t> root;
  for (std::size_t i = 0; i < params.size(); ++i)
    if (!taken[i]) root.push_back(i);
  out.units.push_back(root);  // FlatLayout skips it when empty
  return out;
}

bool default_unit_policy(const std::string&, nn::Module& module) {
  return dynamic_cast<nn::Block*>(&module) != nullptr || dynamic_cast<nn::Linear*>(&module) != nullptr;
}

// Stage 3: this rank keeps its part of each unit; the full flat buffer goes, and each parameter becomes
// a view into its unit's storage, which holds memory only while the unit is gathered.
void ZeroOptimizer::shard_parameters(nn::Module& model) {
  const Device device = flat_params_.device();
  if (parameters_offloaded() && !mixed()) {
    param_shard_ = master_;  // float32: the host's masters are this rank's parameters
  } else {
    MemoryCategoryScope scope(parameters_offloaded() ? MemoryCategory::offloaded : MemoryCategory::parameters);
    param_shard_ = Tensor::empty({layout_.shard()}, parameters_offloaded() ? Device::cpu : device, flat_params_.dtype());
    copy_to_shard(flat_params_, param_shard_);
  }
  const auto& units = layout_.units();
  root_unit_ = units.size();
  for (std::size_t u = 0; u < units.size(); ++u) {
    const FlatUnit& unit = units[u];
    unit_storage_.push_back(std::make_shared<Storage>(
        device, static_cast<std::size_t>(unit.padded) * flat_params_.element_size(), MemoryCategory::communication));
    unit_storage_.back()->release();
    for (std::size_t i : unit.params) {
      params_[i].impl()->storage = unit_storage_.back();
      params_[i].impl()->offset = static_cast<std::size_t>(layout_.offset_of(i) - unit.offset);
    }
  }
  flat_params_ = Tensor();  // every parameter now points at its unit's storage

  // Each wrapped module gathers its unit before its forward and frees it after; its output, marked,
  // gathers it again when backward arrives. The root unit is gathered when the model's forward begins.
  const WrappedUnits wrapped =
      wrapped_units(model, params_, options_.unit_policy ? options_.unit_policy : default_unit_policy);
  for (std::size_t u = 0; u < wrapped.modules.size(); ++u) {
    wrapped.modules[u]->register_forward_pre_hook([this, u](nn::Module&) {
      gather_unit(u);
      prefetch(u + 1);  // forward runs the units in order
    });
    wrapped.modules[u]->register_forward_hook([this, u](nn::Module&, const Tensor& out) {
      release_unit(u);
      return run_before_backward(out, [this, u] {
        gather_unit(u);
        if (u > 0) prefetch(u - 1);  // backward runs them in reverse
      });
    });
  }
  gathering_.resize(units.size());
  staged_.resize(units.size());
  root_unit_ = wrapped.units.back().empty() ? units.size() : units.size() - 1;
  if (root_unit_ < units.size()) model.register_forward_pre_hook([this](nn::Module&) { gather_unit(root_unit_); });
}

void ZeroOptimizer::gather_unit(std::size_t u) {
  start_gather(u);
  if (gathering_[u]) {
    gathering_[u]->wait();
    gathering_[u] = nullptr;
  }
  staged_[u] = Tensor();
}

void ZeroOptimizer::prefetch(std::size_t u) {
  if (options_.prefetch && u < unit_storage_.size() && u != root_unit_) start_gather(u);
}

void ZeroOptimizer::start_gather(std::size_t u) {
  Storage& storage = *unit_storage_[u];
  if (!storage.released()) return;  // gathered, or being gathered
  storage.materialize();
  const FlatUnit& unit = layout_.units()[u];
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = unit_storage_[u];
  impl->shape = {unit.padded};
  impl->dtype = param_shard_.dtype();
  Tensor whole(impl);
  Tensor mine = param_shard_.flat_view(static_cast<std::size_t>(unit.shard_offset), static_cast<std::size_t>(unit.part));
  if (parameters_offloaded()) {  // this rank's part goes up from the host first, kept until the gather lands
    host_.up += static_cast<std::int64_t>(mine.nbytes());
    MemoryCategoryScope scope(MemoryCategory::communication);
    staged_[u] = Tensor::empty({unit.part}, whole.device(), mine.dtype());
    staged_[u].copy_from(mine);
    mine = staged_[u];
  }
  if (group_.size() == 1) whole.copy_from(mine);
  else gathering_[u] = group_.all_gather_async(mine, whole);
  count_ring(comm::OpKind::all_gather, mine.nbytes());
}

void ZeroOptimizer::release_unit(std::size_t u) {
  if (gathering_[u]) {  // a prefetch the pass never used: it must land before its memory goes
    gathering_[u]->wait();
    gathering_[u] = nullptr;
  }
  staged_[u] = Tensor();
  if (!unit_storage_[u]->released()) unit_storage_[u]->release();
}

}  // namespace course::parallel
