// ZeRO's core, every stage: the flat buffers and their layout, the gradients reduced after backward
// (stage 0's all-reduce, stage 1's reduce-scatter), clipping on shards, the sharded AdamW update and
// the parameters' all-gather. Stage 2's reductions during backward are in zero_gradients.cpp, stage 3's
// parameter units in zero_parameters.cpp, the state gathered or saved in zero_state.cpp.
#include "common/parallel/zero.h"

#include <cmath>
#include <limits>
#include <stdexcept>

#include "common/autograd/autograd.h"
#include "common/core/memory.h"
#include "common/faults/faults.h"
#include "common/kernels/kernels.h"
#include "common/nn/gpt.h"
#include "common/nn/layers.h"
#include "common/ops/ops.h"
#include "common/optim/optimizer.h"
#include "common/parallel/zero_units.h"

namespace course::parallel {
namespace {

std::int64_t cap_elements(double megabytes) {
  return std::max<std::int64_t>(1, static_cast<std::int64_t>(megabytes * 1024.0 * 1024.0 / sizeof(float)));
}

FlatLayout make_layout(nn::Module& model, const std::vector<Tensor>& params, int ranks, const ZeroOptions& o) {
  if (o.stage < 0 || o.stage > 3)
    throw std::invalid_argument("ZeroOptimizer: stage " + std::to_string(o.stage) + " is not 0, 1, 2 or 3");
  if (o.offload == ZeroOptions::Offload::parameters && o.stage != 3)
    throw std::invalid_argument("ZeroOptimizer: offloading the parameters needs stage 3 (stage " +
                                std::to_string(o.stage) + " keeps every parameter on every rank)");
  const int shards = o.stage == 0 ? 1 : ranks;
  if (o.stage < 3 && o.unit_cap_mb > 0) return FlatLayout(params, shards, cap_elements(o.unit_cap_mb));
  return FlatLayout(params, shards, wrapped_units(model, params, o.unit_policy ? o.unit_policy : default_unit_policy).units);
}

optim::GradScalerOptions scaler_options(const ZeroOptions& o) {
  optim::GradScalerOptions scaler;
  scaler.init_scale = o.init_scale;
  scaler.enabled = o.precision == DType::float16;
  return scaler;
}

}  // namespace

ZeroOptimizer::ZeroOptimizer(nn::Module& model, comm::Communicator& group, ZeroOptions options)
    : group_(group),
      options_(options),
      params_(model.parameters()),
      layout_(make_layout(model, params_, group.size(), options)),
      scaler_(scaler_options(options), &group) {
  if (params_.empty()) throw std::invalid_argument("ZeroOptimizer: the model has no parameters");
  const Device device = params_.front().device();
  const DType working = options_.precision;

  // The parameters move into one flat buffer, rank 0's values broadcast (every rank starts from them,
  // as DDP). In float32 it is the model's parameters. In mixed precision it holds the masters (at stage
  // 0 all of them, above it this rank's part is kept), and the model computes with their 16-bit
  // roundings. Offloaded, the masters (this rank's part, or all at stage 0) go to the host.
  Tensor whole;
  {
    MemoryCategoryScope scope(!mixed() ? MemoryCategory::parameters
                              : options_.stage == 0 && !offloaded() ? MemoryCategory::optimizer_state
                                                                    : MemoryCategory::communication);
    whole = Tensor::zeros({layout_.padded()}, device);
  }
  for (std::size_t i = 0; i < params_.size(); ++i)
    whole.view(static_cast<std::size_t>(layout_.offset_of(i)), params_[i].shape()).copy_from(params_[i]);
  group_.broadcast(whole, 0);
  if (!mixed()) {
    flat_params_ = whole;
  } else {
    MemoryCategoryScope scope(MemoryCategory::parameters);
    flat_params_ = Tensor::zeros({layout_.padded()}, device, working);
    flat_params_.copy_from(whole);
  }
  if (has_master()) {
    if (options_.stage == 0 && !offloaded()) {
      master_ = whole;
    } else {
      MemoryCategoryScope scope(offloaded() ? MemoryCategory::offloaded : MemoryCategory::optimizer_state);
      master_ = Tensor::empty({options_.stage == 0 ? layout_.padded() : layout_.shard()}, host_or(device));
      if (options_.stage == 0) master_.copy_from(whole);
      else copy_to_shard(whole, master_);
    }
  }
  whole = Tensor();
  // The model's tensors become views into the flat buffer (of the working type).
  for (std::size_t i = 0; i < params_.size(); ++i) {
    Tensor& p = params_[i];
    p.impl()->storage = flat_params_.impl()->storage;
    p.impl()->offset = flat_params_.impl()->offset + static_cast<std::size_t>(layout_.offset_of(i));
    p.impl()->dtype = working;
    weight_decay_.push_back(p.shape().size() >= 2 ? options_.weight_decay : 0.0f);
  }
  if (options_.stage == 3) shard_parameters(model);

  if (options_.stage <= 1) {
    MemoryCategoryScope scope(MemoryCategory::gradients);
    flat_grads_ = Tensor::zeros({layout_.padded()}, device, working);
    for (std::size_t i = 0; i < params_.size(); ++i)
      params_[i].set_grad(flat_grads_.view(static_cast<std::size_t>(layout_.offset_of(i)), params_[i].shape()));
  }
  if (options_.stage >= 1) {
    // Stage 1: the reduce-scatter's output, a communication buffer. Stages 2-3: the only gradient kept,
    // on the host when offloaded (each unit's part goes down as its reduce-scatter completes).
    const bool on_host = offloaded() && options_.stage >= 2;
    MemoryCategoryScope scope(options_.stage == 1 ? MemoryCategory::communication
                              : on_host           ? MemoryCategory::offloaded
                                                  : MemoryCategory::gradients);
    grad_shard_ = Tensor::zeros({layout_.shard()}, on_host ? Device::cpu : device, working);
  }
  {
    MemoryCategoryScope scope(offloaded() ? MemoryCategory::offloaded : MemoryCategory::optimizer_state);
    const std::int64_t n = options_.stage == 0 ? layout_.padded() : layout_.shard();
    exp_avg_ = Tensor::zeros({n}, host_or(device));
    exp_avg_sq_ = Tensor::zeros({n}, host_or(device));
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

void ZeroOptimizer::copy_to_shard(const Tensor& padded, Tensor& shard) const {
  for (std::size_t u = 0; u < layout_.units().size(); ++u) {
    const FlatUnit& unit = layout_.units()[u];
    shard.flat_view(static_cast<std::size_t>(unit.shard_offset), static_cast<std::size_t>(unit.part))
        .copy_from(part_of(padded.flat_view(static_cast<std::size_t>(unit.offset), static_cast<std::size_t>(unit.padded)), u));
  }
}

void ZeroOptimizer::copy_from_shard(const Tensor& shard, Tensor& padded) const {
  for (std::size_t u = 0; u < layout_.units().size(); ++u) {
    const FlatUnit& unit = layout_.units()[u];
    part_of(padded.flat_view(static_cast<std::size_t>(unit.offset), static_cast<std::size_t>(unit.padded)), u)
        .copy_from(shard.flat_view(static_cast<std::size_t>(unit.shard_offset), static_cast<std::size_t>(unit.part)));
  }
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
  const Tensor grads = update_gradients();
  double norm = std::numeric_limits<double>::infinity();
  scaler_.unscale_(std::vector<Tensor>{grads});  // float16: the loss scale undone, overflow agreed by all
  const bool stepped = scaler_.step([&] {
    norm = clip(grads);
    update(grads);
  });
  scaler_.update();
  if (stepped) {
    if (has_master()) round_parameters();
    gather_parameters();
  }
  // Stage 3: every gathered copy is stale now; the next forward gathers the updated shards.
  for (std::size_t u = 0; u < unit_storage_.size(); ++u) release_unit(u);
  bytes_last_step_ = group_.bytes_sent() - bytes_at_last_step_;
  bytes_at_last_step_ = group_.bytes_sent();
  ring_bytes_last_step_ = ring_bytes_;
  ring_bytes_ = 0;
  host_last_step_ = host_;
  host_ = {};
  return norm;
}

// The gradients the update reads, in float32: the held ones themselves, or in mixed precision a
// float32 copy of the 16-bit ones (a transient buffer of this rank's part, as DeepSpeed's). Offloaded,
// on the host: stages 0 and 1 copy their part down now (stages 2 and 3 did during backward).
Tensor ZeroOptimizer::update_gradients() {
  const Tensor& held = options_.stage == 0 ? flat_grads_ : grad_shard_;
  if (offloaded() && options_.stage <= 1) {
    host_.down += static_cast<std::int64_t>(held.nbytes());
    MemoryCategoryScope scope(MemoryCategory::offloaded);
    Tensor down = Tensor::empty(held.shape(), Device::cpu);
    down.copy_from(held);
    return down;
  }
  if (!mixed()) return held;
  MemoryCategoryScope scope(offloaded() ? MemoryCategory::offloaded : MemoryCategory::communication);
  return held.to(DType::float32);
}

// optim::clip_grad_norm_ over the whole model's averaged gradient, from the shards: each rank sums the
// squares of what it holds and the sums are added over the group (at stage 0 every rank holds it all).
double ZeroOptimizer::clip(const Tensor& grads) {
  if (options_.max_grad_norm <= 0) return 0;
  std::vector<comm::Communicator*> groups;
  if (options_.stage > 0) groups.push_back(&group_);
  return optim::clip_grad_norm_({grads}, {grads}, options_.max_grad_norm, groups).item();
}

// AdamW on the pieces of parameters this rank owns: every element is updated by exactly one rank (all
// of them at stage 0) with the same arithmetic as optim::Adam; in mixed precision on the masters.
void ZeroOptimizer::update(const Tensor& grads) {
  ++steps_;
  const AdamParams a{options_.lr, options_.beta1, options_.beta2, options_.eps, true,
                     static_cast<float>(1.0 - std::pow(static_cast<double>(options_.beta1), steps_)),
                     static_cast<float>(1.0 - std::pow(static_cast<double>(options_.beta2), steps_))};
  const int me = options_.stage == 0 ? 0 : group_.rank();
  std::vector<AdamTensor> list;  // every segment this rank owns, one launch on a GPU
  for (std::size_t u = 0; u < layout_.units().size(); ++u) {
    const FlatUnit& unit = layout_.units()[u];
    for (const FlatSegment& s : segments_owned(u, me)) {
      const std::int64_t flat = unit.offset + me * unit.part + s.part_offset, shard = unit.shard_offset + s.part_offset;
      float* param = has_master() ? master_.data() + shard
                     : options_.stage == 3 ? param_shard_.data() + shard
                                           : flat_params_.data() + flat;
      list.push_back({param, grads.data() + shard, exp_avg_.data() + shard, exp_avg_sq_.data() + shard,
                      static_cast<std::size_t>(s.length), weight_decay_[s.param]});
    }
  }
  kernels(grads.device()).adam_step(list, a);
}

// The pieces of unit `u` that rank `rank` updates: the layout's, or options.owned_segments' (chapter 07's
// exercise), each checked to lie inside its parameter and the rank's part before AdamW writes through it.
std::vector<FlatSegment> ZeroOptimizer::segments_owned(std::size_t u, int rank) const {
  if (!options_.owned_segments) return layout_.segments(u, rank);
  const FlatUnit& unit = layout_.units()[u];
  std::vector<std::int64_t> numels;
  for (std::size_t p : unit.params) numels.push_back(layout_.numel_of(p));
  std::vector<FlatSegment> pieces = options_.owned_segments(numels, unit.part, rank);
  for (FlatSegment& s : pieces) {
    const bool inside = s.param < numels.size() && s.length > 0 && s.param_offset >= 0 && s.part_offset >= 0 &&
                        s.param_offset + s.length <= numels[s.param] && s.part_offset + s.length <= unit.part;
    if (!inside)
      throw std::logic_error("ZeroOptimizer: owned_segments gives unit " + std::to_string(u) + ", rank " +
                             std::to_string(rank) + " a piece outside its parameter or its part (parameter " +
                             std::to_string(s.param) + ", from " + std::to_string(s.param_offset) + " in it and " +
                             std::to_string(s.part_offset) + " in the part, " + std::to_string(s.length) +
                             " elements; the part holds " + std::to_string(unit.part) + ")");
    s.param = unit.params[s.param];  // the position in the unit, as the layout numbers parameters
  }
  return pieces;
}

// The masters into the parameters the model computes with: rounded to 16 bits in mixed precision, and
// offloaded, up from the host (with the parameters offloaded they stay there: stage 3 takes each unit's
// part up when it gathers it).
void ZeroOptimizer::round_parameters() {
  if (options_.stage == 0) {
    flat_params_.copy_from(master_);
  } else if (options_.stage == 3) {
    if (param_shard_.impl()->storage == master_.impl()->storage) return;  // float32, parameters offloaded
    param_shard_.copy_from(master_);
  } else {
    copy_from_shard(master_, flat_params_);
  }
  if (offloaded() && !parameters_offloaded())
    host_.up += (options_.stage == 0 ? layout_.padded() : layout_.shard()) * static_cast<std::int64_t>(element_size(options_.precision));
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

void ZeroOptimizer::zero_grad() {
  if (flat_grads_.defined()) flat_grads_.fill_(0.0f);
  if (options_.stage >= 2) grad_shard_.fill_(0.0f);
}

const char* offload_name(ZeroOptions::Offload offload) {
  switch (offload) {
    case ZeroOptions::Offload::none: return "none";
    case ZeroOptions::Offload::optimizer: return "optimizer";
    case ZeroOptions::Offload::parameters: return "parameters";
  }
  return "none";
}

Tensor ZeroOptimizer::forward_backward(const std::function<Tensor()>& forward) const {
  // --fault skip-rank-share (chapter 07): the last rank's share is lost, its loss weighted 0. Only the
  // run goes through here; the check's reference computes each share on its own.
  if (faults::active("skip-rank-share") && group_.rank() == group_.size() - 1)
    return mixed_.forward_backward([&] { return scale(forward(), 0.0f); });
  return mixed_.forward_backward(forward);
}

}  // namespace course::parallel
