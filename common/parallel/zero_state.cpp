// ZeRO's state as a whole or as this rank's shard: the full parameters, gradients and optimizer state
// gathered for inspection (verification, consolidation), and the shard a checkpoint saves and restores.
#include <stdexcept>

#include "common/autograd/autograd.h"
#include "common/core/memory.h"
#include "common/kernels/kernels.h"
#include "common/parallel/zero.h"

namespace course::parallel {

// What full_parameters and gather_flat send is inspection, not training: left out of the step's bytes.
class ZeroOptimizer::Uncounted {
 public:
  explicit Uncounted(ZeroOptimizer& zero)
      : zero_(zero), sent_(zero.group_.bytes_sent()), ring_(zero.ring_bytes_), host_(zero.host_) {}
  ~Uncounted() {
    zero_.bytes_at_last_step_ += zero_.group_.bytes_sent() - sent_;
    zero_.ring_bytes_ = ring_;
    zero_.host_ = host_;
  }

 private:
  ZeroOptimizer& zero_;
  std::int64_t sent_, ring_;
  HostTraffic host_;
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
      Tensor gathered = Tensor::empty({unit.padded}, buffer.device(), buffer.dtype());
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
  std::vector<float> averages = gather_flat(options_.stage == 0 ? flat_grads_ : grad_shard_);
  if (scaler_.is_enabled()) {  // float16: unscaled as unscale_ will (the scale a power of two: exact)
    const float inverse = 1.0f / scaler_.get_scale();
    for (float& g : averages) g *= inverse;
  }
  return averages;
}

ZeroOptimizer::FullState ZeroOptimizer::full_optimizer_state() {
  return {gather_flat(exp_avg_), gather_flat(exp_avg_sq_)};
}

std::vector<float> ZeroOptimizer::full_parameters() {
  if (has_master()) return gather_flat(master_);
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

std::vector<std::pair<std::string, Tensor>> ZeroOptimizer::state_shard() const {
  if (options_.stage == 0) {
    if (group_.rank() != 0) return {};
    return {{"param", (has_master() ? master_ : flat_params_).clone()}, {"exp_avg", exp_avg_.clone()},
            {"exp_avg_sq", exp_avg_sq_.clone()}};
  }
  Tensor param;
  if (has_master()) {
    param = master_.clone();
  } else if (options_.stage == 3) {
    param = param_shard_.clone();
  } else {
    param = Tensor::empty({layout_.shard()}, flat_params_.device());
    copy_to_shard(flat_params_, param);
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
  if (has_master()) {  // the masters, and the parameters rounded (or copied up) from them
    if (param) master_.copy_from(*param);
    if (options_.stage == 0) {
      group_.broadcast(master_, 0);
      group_.broadcast(exp_avg_, 0);
      group_.broadcast(exp_avg_sq_, 0);
    }
    round_parameters();
    gather_parameters();
    for (std::size_t u = 0; u < unit_storage_.size(); ++u) release_unit(u);
    host_ = {};  // a resume's copies are not a step's
  } else if (options_.stage == 0) {
    if (param) flat_params_.copy_from(*param);
    group_.broadcast(flat_params_, 0);
    group_.broadcast(exp_avg_, 0);
    group_.broadcast(exp_avg_sq_, 0);
  } else if (options_.stage == 3) {
    param_shard_.copy_from(*param);
    for (std::size_t u = 0; u < unit_storage_.size(); ++u) release_unit(u);  // any gathered copy is stale
  } else {
    copy_from_shard(*param, flat_params_);
    gather_parameters();
  }
  steps_ = steps;
}

}  // namespace course::parallel
