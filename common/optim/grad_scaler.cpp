// The loss scaler: a sum per gradient finds an inf or NaN (they survive any sum), the group agrees on it.
#include "common/optim/grad_scaler.h"


#include <cmath>
#include <map>
#include <stdexcept>

#include "common/comm/agree.h"
#include "common/kernels/kernels.h"
#include "common/ops/ops.h"

namespace course::optim {

GradScaler::GradScaler(GradScalerOptions options, comm::Communicator* group)
    : options_(options), group_(group), scale_(options.init_scale) {
  if (!(options.init_scale > 0.0f) || !(options.growth_factor > 1.0f) || !(options.backoff_factor > 0.0f) ||
      !(options.backoff_factor < 1.0f) || options.growth_interval < 1)
    throw std::invalid_argument(
        "GradScaler: needs init_scale > 0, growth_factor > 1, 0 < backoff_factor < 1 and growth_interval >= 1");
}

Tensor GradScaler::scale(const Tensor& loss) const { return options_.enabled ? course::scale(loss, scale_) : loss; }

void GradScaler::unscale_(Optimizer& optimizer) {
  std::vector<Tensor> gradients;
  for (const Tensor& p : optimizer.params())
    if (p.grad().defined()) gradients.push_back(p.grad());
  unscale_(gradients);
}

void GradScaler::unscale_(const std::vector<Tensor>& gradients) {
  if (!options_.enabled) return;
  if (unscaled_) throw std::logic_error("GradScaler: unscale_() has already been called since the last update()");
  unscaled_ = true;
  bool found = false;
  const float inverse = 1.0f / scale_;
  // Each gradient's sum into one slot of one tensor per device, all read by the host at once: one wait a
  // step (as torch.amp's GradScaler.step reads its found_inf), not one a gradient.
  std::map<Device, std::pair<Tensor, std::size_t>> sums;
  for (const Tensor& g : gradients) ++sums[g.device()].second;
  for (auto& [device, slots] : sums) slots = {Tensor::empty({static_cast<std::int64_t>(slots.second)}, device), 0};
  for (const Tensor& g : gradients) {
    Kernels& k = kernels(g.device());
    auto& [totals, used] = sums[g.device()];
    k.scale(g.data(), inverse, g.data(), static_cast<std::size_t>(g.numel()));
    k.sum(g.data(), static_cast<std::size_t>(g.numel()), totals.data() + used++);
  }
  for (const auto& [device, slots] : sums)
    for (float total : slots.first.to_host()) found = found || !std::isfinite(total);
  if (group_) found = comm::all_reduce_scalar(*group_, found ? 1.0f : 0.0f, comm::ReduceOp::max) > 0.0f;
  found_inf_ = found;
}

void GradScaler::load_state(const GradScalerState& state) {
  if (!options_.enabled) {
    if (state.scale != 0.0f) throw std::invalid_argument("GradScaler: a loss scale was saved, but this run has none");
    return;
  }
  if (!(state.scale > 0.0f) || !std::isfinite(state.scale) || state.growth_tracker < 0 || state.skipped < 0)
    throw std::invalid_argument("GradScaler: no loss scale was saved (or an invalid one), but this run scales its loss");
  scale_ = state.scale;
  growth_tracker_ = state.growth_tracker;
  skipped_ = state.skipped;
}

void GradScaler::unscale_gradients(const std::vector<Tensor>& params) const {
  if (!options_.enabled) return;
  for (const Tensor& p : params) {
    Tensor g = p.grad();
    if (g.defined()) kernels(g.device()).scale(g.data(), 1.0f / scale_, g.data(), static_cast<std::size_t>(g.numel()));
  }
  if (auto* listener = UnscaleListener::current()) listener->unscaled(params, 1.0 / scale_);
}

namespace {
thread_local UnscaleListener* t_listener = nullptr;
}  // namespace

UnscaleListener::UnscaleListener() : previous_(t_listener) { t_listener = this; }
UnscaleListener::~UnscaleListener() { t_listener = previous_; }
UnscaleListener* UnscaleListener::current() { return t_listener; }

bool GradScaler::step(Optimizer& optimizer) {
  if (options_.enabled && !unscaled_) unscale_(optimizer);
  return step([&] { optimizer.step(); });
}

bool GradScaler::step(const std::function<void()>& update) {
  if (options_.enabled && !unscaled_) throw std::logic_error("GradScaler: step() before unscale_()");
  if (options_.enabled && found_inf_) {
    ++skipped_;
    return false;
  }
  update();
  return true;
}

void GradScaler::update() {
  if (!options_.enabled) return;
  if (found_inf_) {
    scale_ *= options_.backoff_factor;
    growth_tracker_ = 0;
  } else if (++growth_tracker_ == options_.growth_interval) {
    scale_ *= options_.growth_factor;
    growth_tracker_ = 0;
  }
  unscaled_ = false;
  found_inf_ = false;
}

}  // namespace course::optim
