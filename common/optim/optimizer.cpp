// SGD and Adam: the arithmetic is in the kernels (common/kernels/math.h), shared by CPU and CUDA.
#include "common/optim/optimizer.h"

#include <cmath>
#include <stdexcept>

#include "common/kernels/kernels.h"

namespace course::optim {

Optimizer::Optimizer(std::vector<Tensor> params, float lr) : params_(std::move(params)), lr_(lr) {
  if (!(lr > 0.0f) || !std::isfinite(lr)) throw UsageError("learning rate " + std::to_string(lr) + " must be a positive finite number");
}

void Optimizer::zero_grad() {
  for (auto& p : params_) p.zero_grad();
}

SGD::SGD(std::vector<Tensor> params, float lr, float momentum, float weight_decay)
    : Optimizer(std::move(params), lr), momentum_(momentum), weight_decay_(weight_decay) {}

void Optimizer::load_state(const std::vector<std::pair<std::string, Tensor>>& state, long steps) {
  if (steps < 0) throw std::invalid_argument("optimizer state: negative step count " + std::to_string(steps));
  if (steps == 0 && state.empty()) return;  // saved before the first step: nothing to restore
  auto mine = allocate_state();
  if (state.size() != mine.size())
    throw std::invalid_argument("optimizer state: " + std::to_string(state.size()) + " tensors, this optimizer has " +
                                std::to_string(mine.size()));
  std::vector<const Tensor*> source(mine.size(), nullptr);  // matched by name, in any order
  for (std::size_t i = 0; i < mine.size(); ++i) {
    for (const auto& [name, saved] : state)
      if (name == mine[i].first) source[i] = &saved;
    if (!source[i]) throw std::invalid_argument("optimizer state: '" + mine[i].first + "' is missing");
    if (source[i]->shape() != mine[i].second.shape())
      throw std::invalid_argument("optimizer state: '" + mine[i].first + "' has shape " +
                                  shape_string(source[i]->shape()) + ", this optimizer's has " +
                                  shape_string(mine[i].second.shape()));
  }
  for (std::size_t i = 0; i < mine.size(); ++i) mine[i].second.copy_from(*source[i]);
  steps_ = steps;
}

std::vector<std::pair<std::string, Tensor>> SGD::allocate_state() {
  if (momentum_ != 0.0f && momentum_buffers_.empty()) {
    MemoryCategoryScope scope(MemoryCategory::optimizer_state);
    for (auto& p : params_) momentum_buffers_.push_back(Tensor::zeros(p.shape(), p.device()));
  }
  return state();
}

void SGD::step() {
  allocate_state();
  SgdParams s{lr_, momentum_, weight_decay_};
  for (std::size_t i = 0; i < params_.size(); ++i) {
    Tensor g = params_[i].grad();
    if (!g.defined()) continue;
    float* buffer = momentum_buffers_.empty() ? nullptr : momentum_buffers_[i].data();
    kernels(params_[i].device()).sgd_step(params_[i].data(), g.data(), buffer,
                                          static_cast<std::size_t>(params_[i].numel()), s);
  }
  ++steps_;
}

std::vector<std::pair<std::string, Tensor>> SGD::state() const {
  std::vector<std::pair<std::string, Tensor>> out;
  for (std::size_t i = 0; i < momentum_buffers_.size(); ++i)
    out.emplace_back(std::to_string(i) + ".momentum", momentum_buffers_[i]);
  return out;
}

Adam::Adam(std::vector<Tensor> params, float lr, float beta1, float beta2, float eps, float weight_decay,
           bool decoupled)
    : Optimizer(std::move(params), lr), beta1_(beta1), beta2_(beta2), eps_(eps), weight_decay_(weight_decay),
      decoupled_(decoupled) {}

std::vector<std::pair<std::string, Tensor>> Adam::allocate_state() {
  if (exp_avg_.empty()) {
    MemoryCategoryScope scope(MemoryCategory::optimizer_state);
    for (auto& p : params_) {
      exp_avg_.push_back(Tensor::zeros(p.shape(), p.device()));
      exp_avg_sq_.push_back(Tensor::zeros(p.shape(), p.device()));
    }
  }
  return state();
}

void Adam::step() {
  allocate_state();
  ++steps_;
  AdamParams a{lr_, beta1_, beta2_, eps_, weight_decay_, decoupled_,
               static_cast<float>(1.0 - std::pow(static_cast<double>(beta1_), steps_)),
               static_cast<float>(1.0 - std::pow(static_cast<double>(beta2_), steps_))};
  for (std::size_t i = 0; i < params_.size(); ++i) {
    Tensor g = params_[i].grad();
    if (!g.defined()) continue;
    kernels(params_[i].device()).adam_step(params_[i].data(), g.data(), exp_avg_[i].data(), exp_avg_sq_[i].data(),
                                           static_cast<std::size_t>(params_[i].numel()), a);
  }
}

std::vector<std::pair<std::string, Tensor>> Adam::state() const {
  std::vector<std::pair<std::string, Tensor>> out;
  for (std::size_t i = 0; i < exp_avg_.size(); ++i) {
    out.emplace_back(std::to_string(i) + ".exp_avg", exp_avg_[i]);
    out.emplace_back(std::to_string(i) + ".exp_avg_sq", exp_avg_sq_[i]);
  }
  return out;
}

}  // namespace course::optim
