// ZeRO stages 0-2: the flat buffers, the reductions, clipping on shards, the sharded AdamW update and
// the parameters' all-gather.
#include "common/parallel/zero.h"

#include <cmath>
#include <stdexcept>

#include "common/autograd/autograd.h"
#include "common/core/memory.h"
#include "common/kernels/kernels.h"
#include "common/nn/gpt.h"
#include "common/nn/layers.h"
#include "common/optim/optimizer.h"

namespace course::parallel {
namespace {

std::int64_t cap_elements(double megabytes) {
  return std::max<std::int64_t>(1, static_cast<std::int64_t>(megabytes * 1024.0 * 1024.0 / sizeof(float)));
}

// Stage 3's units: the outermost modules the policy wraps, in forward (registration) order, each with
// its module; then the root unit of every parameter left over (empty when none is).
struct WrappedUnits {
  std::vector<std::vector<std::size_t>> units;
  std::vector<nn::Module*> modules;  // modules[k] owns units[k]; the root unit, last, has none
};

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

FlatLayout make_layout(nn::Module& model, const std::vector<Tensor>& params, int ranks, const ZeroOptions& o) {
  if (o.stage < 0 || o.stage > 3)
    throw std::invalid_argument("ZeroOptimizer: stage " + std::to_string(o.stage) + " is not 0, 1, 2 or 3");
  const int shards = o.stage == 0 ? 1 : ranks;
  if (o.stage < 3 && o.unit_cap_mb > 0) return FlatLayout(params, shards, cap_elements(o.unit_cap_mb));
  return FlatLayout(params, shards, wrapped_units(model, params, o.unit_policy ? o.unit_policy : default_unit_policy).units);
}

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

bool default_unit_policy(const std::string&, nn::Module& module) {
  return dynamic_cast<nn::Block*>(&module) != nullptr || dynamic_cast<nn::Linear*>(&module) != nullptr;
}

ZeroOptimizer::ZeroOptimizer(nn::Module& model, comm::Communicator& group, ZeroOptions options)
    : group_(group),
      options_(options),
      params_(model.parameters()),
      layout_(make_layout(model, params_, group.size(), options)) {
  if (params_.empty()) throw std::invalid_argument("ZeroOptimizer: the model has no parameters");
  const Device device = params_.front().device();

  // The parameters move into one flat buffer; the model's tensors become views into it.
  {
    MemoryCategoryScope scope(MemoryCategory::parameters);
    flat_params_ = Tensor::zeros({layout_.padded()}, device);
  }
  for (std::size_t i = 0; i < params_.size(); ++i) {
    Tensor& p = params_[i];
    const auto offset = static_cast<std::size_t>(layout_.offset_of(i));
    flat_params_.view(offset, p.shape()).copy_from(p);
    p.impl()->storage = flat_params_.impl()->storage;
    p.impl()->offset = flat_params_.impl()->offset + offset;
    weight_decay_.push_back(p.shape().size() >= 2 ? options_.weight_decay : 0.0f);
  }
  group_.broadcast(flat_params_, 0);  // every rank starts from rank 0's values, as DDP
  if (options_.stage == 3) shard_parameters(model);

  if (options_.stage <= 1) {
    MemoryCategoryScope scope(MemoryCategory::gradients);
    flat_grads_ = Tensor::zeros({layout_.padded()}, device);
    for (std::size_t i = 0; i < params_.size(); ++i)
      params_[i].set_grad(flat_grads_.view(static_cast<std::size_t>(layout_.offset_of(i)), params_[i].shape()));
  }
  if (options_.stage >= 1) {
    // Stage 1: the reduce-scatter's output, a communication buffer. Stage 2: the only gradient kept.
    MemoryCategoryScope scope(options_.stage == 1 ? MemoryCategory::communication : MemoryCategory::gradients);
    grad_shard_ = Tensor::zeros({layout_.shard()}, device);
  }
  {
    MemoryCategoryScope scope(MemoryCategory::optimizer_state);
    const std::int64_t n = options_.stage == 0 ? layout_.padded() : layout_.shard();
    exp_avg_ = Tensor::zeros({n}, device);
    exp_avg_sq_ = Tensor::zeros({n}, device);
  }
  if (options_.stage >= 2) {
    pending_.resize(layout_.units().size());
    for (std::size_t i = 0; i < params_.size(); ++i) {
      params_[i].set_grad(Tensor());
      // A parameter's own gradient lives only until it is copied into its unit's buffer: a
      // communication buffer in ZeRO's accounting, not a gradient kept.
      params_[i].impl()->grad_category = MemoryCategory::communication;
      params_[i].register_post_accumulate_grad_hook([this, i](Tensor&) { on_gradient_ready(i); });
    }
  }
  bytes_at_last_step_ = group_.bytes_sent();
}

Tensor ZeroOptimizer::part_of(const Tensor& buffer, std::size_t unit) const {
  const FlatUnit& u = layout_.units()[unit];
  return buffer.flat_view(static_cast<std::size_t>(group_.rank() * u.part), static_cast<std::size_t>(u.part));
}

void ZeroOptimizer::on_gradient_ready(std::size_t i) {
  complete_finished_units(false);  // free what has arrived, so only the units in flight hold memory
  const std::size_t u = layout_.unit_of(i);
  const FlatUnit& unit = layout_.units()[u];
  PendingUnit& pending = pending_[u];
  if (pending.work) complete_unit(u);  // the previous pass's reduction of this unit (accumulation)
  Tensor& p = params_[i];
  if (!pending.buffer.defined()) {
    MemoryCategoryScope scope(MemoryCategory::communication);
    pending.buffer = Tensor::zeros({unit.padded}, p.device());
    pending.missing = unit.params.size();
  }
  Tensor grad = p.grad();
  kernels(p.device()).copy(pending.buffer.data() + (layout_.offset_of(i) - unit.offset), grad.data(),
                           static_cast<std::size_t>(grad.numel()));
  p.set_grad(Tensor());  // freed now: the whole model's gradients never exist at once
  if (--pending.missing == 0) {
    reduce_unit_async(u);
    if (options_.stage == 3 && u != root_unit_) release_unit(u);  // its backward is done: reshard
  }
}

// Stage 3: this rank keeps its part of each unit; the full flat buffer goes, and each parameter becomes
// a view into its unit's storage, which holds memory only while the unit is gathered.
void ZeroOptimizer::shard_parameters(nn::Module& model) {
  const Device device = flat_params_.device();
  {
    MemoryCategoryScope scope(MemoryCategory::parameters);
    param_shard_ = Tensor::empty({layout_.shard()}, device);
  }
  const auto& units = layout_.units();
  root_unit_ = units.size();
  for (std::size_t u = 0; u < units.size(); ++u) {
    const FlatUnit& unit = units[u];
    param_shard_.flat_view(static_cast<std::size_t>(unit.shard_offset), static_cast<std::size_t>(unit.part))
        .copy_from(flat_params_.flat_view(static_cast<std::size_t>(unit.offset + group_.rank() * unit.part),
                                          static_cast<std::size_t>(unit.part)));
    unit_storage_.push_back(std::make_shared<Storage>(device, static_cast<std::size_t>(unit.padded) * sizeof(float),
                                                      MemoryCategory::communication));
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
  root_unit_ = wrapped.units.back().empty() ? units.size() : units.size() - 1;
  if (root_unit_ < units.size()) model.register_forward_pre_hook([this](nn::Module&) { gather_unit(root_unit_); });
}

void ZeroOptimizer::gather_unit(std::size_t u) {
  start_gather(u);
  if (gathering_[u]) {
    gathering_[u]->wait();
    gathering_[u] = nullptr;
  }
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
  Tensor whole(impl);
  Tensor mine = param_shard_.flat_view(static_cast<std::size_t>(unit.shard_offset), static_cast<std::size_t>(unit.part));
  if (group_.size() == 1) whole.copy_from(mine);
  else gathering_[u] = group_.all_gather_async(mine, whole);
  count_ring(comm::OpKind::all_gather, mine.nbytes());
}

void ZeroOptimizer::count_ring(comm::OpKind kind, std::size_t bytes) {
  const auto n = static_cast<std::int64_t>(group_.size()), b = static_cast<std::int64_t>(bytes);
  switch (kind) {
    case comm::OpKind::all_reduce: ring_bytes_ += 2 * (n - 1) * b / n; break;
    case comm::OpKind::reduce_scatter: ring_bytes_ += (n - 1) * b / n; break;
    case comm::OpKind::all_gather: ring_bytes_ += (n - 1) * b; break;
    default: break;
  }
}

void ZeroOptimizer::release_unit(std::size_t u) {
  if (gathering_[u]) {  // a prefetch the pass never used: it must land before its memory goes
    gathering_[u]->wait();
    gathering_[u] = nullptr;
  }
  if (!unit_storage_[u]->released()) unit_storage_[u]->release();
}

// What full_parameters and gather_flat send is inspection, not training: left out of the step's bytes.
class ZeroOptimizer::Uncounted {
 public:
  explicit Uncounted(ZeroOptimizer& zero) : zero_(zero), sent_(zero.group_.bytes_sent()), ring_(zero.ring_bytes_) {}
  ~Uncounted() {
    zero_.bytes_at_last_step_ += zero_.group_.bytes_sent() - sent_;
    zero_.ring_bytes_ = ring_;
  }

 private:
  ZeroOptimizer& zero_;
  std::int64_t sent_, ring_;
};

std::vector<float> ZeroOptimizer::gather_flat(const Tensor& buffer) {
  const Uncounted inspection(*this);
  std::vector<float> whole;
  if (options_.stage == 0) {
    whole = buffer.to_host();
  } else {
    whole.resize(static_cast<std::size_t>(layout_.padded()));
    for (std::size_t u = 0; u < layout_.units().size(); ++u) {
      const FlatUnit& unit = layout_.units()[u];
      const Tensor mine = buffer.flat_view(static_cast<std::size_t>(unit.shard_offset), static_cast<std::size_t>(unit.part));
      Tensor gathered = Tensor::empty({unit.padded}, buffer.device());
      if (group_.size() == 1) gathered.copy_from(mine);
      else group_.all_gather(mine, gathered);
      const auto values = gathered.to_host();
      std::copy(values.begin(), values.end(), whole.begin() + unit.offset);
    }
  }
  std::vector<float> out;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const auto at = whole.begin() + layout_.offset_of(i);
    out.insert(out.end(), at, at + params_[i].numel());
  }
  return out;
}

std::vector<float> ZeroOptimizer::full_gradients() {
  return gather_flat(options_.stage == 0 ? flat_grads_ : grad_shard_);  // the averages
}

ZeroOptimizer::FullState ZeroOptimizer::full_optimizer_state() {
  return {gather_flat(exp_avg_), gather_flat(exp_avg_sq_)};
}

std::vector<float> ZeroOptimizer::full_parameters() {
  const Uncounted inspection(*this);
  // Unit by unit, each released again before the next is gathered: no more memory than a forward holds.
  std::vector<std::size_t> offset(params_.size(), 0);
  std::size_t total = 0;
  for (std::size_t i = 0; i < params_.size(); ++i) offset[i] = total, total += static_cast<std::size_t>(params_[i].numel());
  std::vector<float> out(total);
  for (std::size_t u = 0; u < layout_.units().size(); ++u) {
    const bool was_released = u < unit_storage_.size() && unit_storage_[u]->released();
    if (u < unit_storage_.size()) gather_unit(u);
    for (std::size_t i : layout_.units()[u].params) {
      const auto values = params_[i].to_host();
      std::copy(values.begin(), values.end(), out.begin() + static_cast<long>(offset[i]));
    }
    if (was_released) release_unit(u);
  }
  return out;
}

void ZeroOptimizer::reduce_unit_async(std::size_t u) {
  PendingUnit& pending = pending_[u];
  MemoryCategoryScope scope(MemoryCategory::communication);
  pending.reduced = Tensor::empty({layout_.units()[u].part}, pending.buffer.device());
  pending.work = group_.reduce_scatter_async(pending.buffer, pending.reduced, comm::ReduceOp::average);
  count_ring(comm::OpKind::reduce_scatter, pending.buffer.nbytes());
  in_flight_.push_back(u);
  // Double buffering, as DeepSpeed's reduce buckets: with more than two units in flight, wait for the
  // oldest, so the gradients held beyond the shard stay about two units whatever the model's size.
  while (in_flight_.size() > kMaxUnitsInFlight) {
    const std::size_t oldest = in_flight_.front();
    if (pending_[oldest].work) complete_unit(oldest);
    else in_flight_.pop_front();
  }
}

// Waits for unit u's reduce-scatter, adds this rank's part into its gradient shard (passes accumulate),
// and frees the unit's buffers.
void ZeroOptimizer::complete_unit(std::size_t u) {
  PendingUnit& pending = pending_[u];
  pending.work->wait();
  Tensor mine = grad_shard_.flat_view(static_cast<std::size_t>(layout_.units()[u].shard_offset),
                                      static_cast<std::size_t>(layout_.units()[u].part));
  kernels(mine.device()).binary(BinaryOp::add, mine.data(), static_cast<std::size_t>(mine.numel()),
                                pending.reduced.data(), static_cast<std::size_t>(mine.numel()), mine.data(),
                                static_cast<std::size_t>(mine.numel()));
  pending = PendingUnit{};
  for (auto it = in_flight_.begin(); it != in_flight_.end(); ++it)
    if (*it == u) {
      in_flight_.erase(it);
      break;
    }
}

void ZeroOptimizer::complete_finished_units(bool all) {
  for (std::size_t u = 0; u < pending_.size(); ++u)
    if (pending_[u].work && (all || pending_[u].work->test())) complete_unit(u);
}

void ZeroOptimizer::finish_reductions() {
  // Units some of whose parameters had no gradient this pass are reduced now, in unit order on every rank.
  for (std::size_t u = 0; u < pending_.size(); ++u)
    if (pending_[u].buffer.defined() && !pending_[u].work) reduce_unit_async(u);  // keeps the buffer until done
  complete_finished_units(true);
}

double ZeroOptimizer::step() {
  reduce_gradients();
  return apply();
}

void ZeroOptimizer::reduce_gradients() {
  autograd::NoGradGuard no_grad;
  for (auto& gathering : gathering_)  // a prefetch that no pass used lands before the shards change
    if (gathering) {
      gathering->wait();
      gathering = nullptr;
    }
  if (options_.stage == 0) {
    if (group_.size() > 1) group_.all_reduce(flat_grads_, comm::ReduceOp::average);
    count_ring(comm::OpKind::all_reduce, flat_grads_.nbytes());
  } else if (options_.stage == 1) {
    for (std::size_t u = 0; u < layout_.units().size(); ++u) {
      const FlatUnit& unit = layout_.units()[u];
      Tensor whole = flat_grads_.flat_view(static_cast<std::size_t>(unit.offset), static_cast<std::size_t>(unit.padded));
      Tensor mine = grad_shard_.flat_view(static_cast<std::size_t>(unit.shard_offset), static_cast<std::size_t>(unit.part));
      group_.reduce_scatter(whole, mine, comm::ReduceOp::average);
      count_ring(comm::OpKind::reduce_scatter, whole.nbytes());
    }
  } else {
    finish_reductions();
  }
}

double ZeroOptimizer::apply() {
  autograd::NoGradGuard no_grad;
  const double norm = clip();
  update();
  gather_parameters();
  // Stage 3: every gathered copy is stale now; the next forward gathers the updated shards.
  for (std::size_t u = 0; u < unit_storage_.size(); ++u) release_unit(u);
  bytes_last_step_ = group_.bytes_sent() - bytes_at_last_step_;
  bytes_at_last_step_ = group_.bytes_sent();
  ring_bytes_last_step_ = ring_bytes_;
  ring_bytes_ = 0;
  return norm;
}

// optim::clip_grad_norm_ over the whole model's averaged gradient, from the shards: each rank sums the
// squares of what it holds and the sums are added over the group (at stage 0 every rank holds it all).
double ZeroOptimizer::clip() {
  if (options_.max_grad_norm <= 0) return 0;
  const Tensor& held = options_.stage == 0 ? flat_grads_ : grad_shard_;
  std::vector<comm::Communicator*> groups;
  if (options_.stage > 0) groups.push_back(&group_);
  return optim::clip_grad_norm_({held}, {held}, options_.max_grad_norm, groups);
}

// AdamW on the pieces of parameters this rank owns: every element is updated by exactly one rank (all
// of them at stage 0) with the same arithmetic as optim::Adam.
void ZeroOptimizer::update() {
  ++steps_;
  AdamParams a{options_.lr, options_.beta1, options_.beta2, options_.eps, 0.0f, true,
               static_cast<float>(1.0 - std::pow(static_cast<double>(options_.beta1), steps_)),
               static_cast<float>(1.0 - std::pow(static_cast<double>(options_.beta2), steps_))};
  const int me = options_.stage == 0 ? 0 : group_.rank();
  const Tensor& grads = options_.stage == 0 ? flat_grads_ : grad_shard_;
  Kernels& k = kernels(grads.device());
  for (std::size_t u = 0; u < layout_.units().size(); ++u) {
    const FlatUnit& unit = layout_.units()[u];
    for (const FlatSegment& s : layout_.segments(u, me)) {
      const std::int64_t flat = unit.offset + me * unit.part + s.part_offset, shard = unit.shard_offset + s.part_offset;
      a.weight_decay = weight_decay_[s.param];
      float* param = options_.stage == 3 ? param_shard_.data() + shard : flat_params_.data() + flat;
      k.adam_step(param, grads.data() + shard, exp_avg_.data() + shard,
                  exp_avg_sq_.data() + shard, static_cast<std::size_t>(s.length), a);
    }
  }
}

void ZeroOptimizer::gather_parameters() {
  if (options_.stage == 0 || options_.stage == 3 || group_.size() == 1) return;
  for (std::size_t u = 0; u < layout_.units().size(); ++u) {
    const FlatUnit& unit = layout_.units()[u];
    Tensor whole = flat_params_.flat_view(static_cast<std::size_t>(unit.offset), static_cast<std::size_t>(unit.padded));
    MemoryCategoryScope scope(MemoryCategory::communication);
    Tensor mine = part_of(whole, u).clone();  // the input may not alias the output
    group_.all_gather(mine, whole);
    count_ring(comm::OpKind::all_gather, mine.nbytes());
  }
}

std::vector<std::pair<std::string, Tensor>> ZeroOptimizer::state_shard() const {
  if (options_.stage == 0) {
    if (group_.rank() != 0) return {};
    return {{"param", flat_params_.clone()}, {"exp_avg", exp_avg_.clone()}, {"exp_avg_sq", exp_avg_sq_.clone()}};
  }
  Tensor param;
  if (options_.stage == 3) {
    param = param_shard_.clone();
  } else {
    param = Tensor::empty({layout_.shard()}, flat_params_.device());
    for (std::size_t u = 0; u < layout_.units().size(); ++u) {
      const FlatUnit& unit = layout_.units()[u];
      param.flat_view(static_cast<std::size_t>(unit.shard_offset), static_cast<std::size_t>(unit.part))
          .copy_from(part_of(flat_params_.flat_view(static_cast<std::size_t>(unit.offset),
                                                    static_cast<std::size_t>(unit.padded)), u));
    }
  }
  return {{"param", param}, {"exp_avg", exp_avg_.clone()}, {"exp_avg_sq", exp_avg_sq_.clone()}};
}

void ZeroOptimizer::load_state_shard(const std::vector<std::pair<std::string, Tensor>>& state, long steps) {
  autograd::NoGradGuard no_grad;
  auto find = [&](const std::string& name) -> const Tensor& {
    for (const auto& [n, t] : state)
      if (n == name) return t;
    throw std::invalid_argument("ZeroOptimizer::load_state_shard: no tensor '" + name + "'");
  };
  const bool holds = options_.stage != 0 || group_.rank() == 0;
  if (holds) {
    const std::int64_t n = options_.stage == 0 ? layout_.padded() : layout_.shard();
    for (const char* name : {"param", "exp_avg", "exp_avg_sq"})
      if (find(name).numel() != n)
        throw std::invalid_argument(std::string("ZeroOptimizer::load_state_shard: '") + name + "' has " +
                                    std::to_string(find(name).numel()) + " elements; this rank's part has " +
                                    std::to_string(n));
    exp_avg_.copy_from(find("exp_avg"));
    exp_avg_sq_.copy_from(find("exp_avg_sq"));
  }
  const Tensor* param = holds ? &find("param") : nullptr;
  if (options_.stage == 0) {
    if (param) flat_params_.copy_from(*param);
    group_.broadcast(flat_params_, 0);
    group_.broadcast(exp_avg_, 0);
    group_.broadcast(exp_avg_sq_, 0);
  } else if (options_.stage == 3) {
    param_shard_.copy_from(*param);
    for (std::size_t u = 0; u < unit_storage_.size(); ++u) release_unit(u);  // any gathered copy is stale
  } else {
    for (std::size_t u = 0; u < layout_.units().size(); ++u) {
      const FlatUnit& unit = layout_.units()[u];
      part_of(flat_params_.flat_view(static_cast<std::size_t>(unit.offset), static_cast<std::size_t>(unit.padded)), u)
          .copy_from(param->flat_view(static_cast<std::size_t>(unit.shard_offset), static_cast<std::size_t>(unit.part)));
    }
    gather_parameters();
  }
  steps_ = steps;
}

void ZeroOptimizer::zero_grad() {
  if (flat_grads_.defined()) flat_grads_.fill_(0.0f);
  if (options_.stage >= 2) grad_shard_.fill_(0.0f);
}

}  // namespace course::parallel
