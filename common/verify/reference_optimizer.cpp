// SGD, Adam and AdamW written out from their papers, element by element.
#include "common/verify/reference_optimizer.h"

#include <cmath>
#include <stdexcept>

#include "common/kernels/rounded.h"

namespace course::verify {

ReferenceOptimizer::ReferenceOptimizer(const optim::Optimizer& optimizer, const nn::Module& model)
    : settings_(optimizer.settings()), steps_(optimizer.steps_taken()) {
  const auto& params = optimizer.params();
  const auto state = optimizer.state();
  auto state_of = [&](std::size_t i, const std::string& what) -> const Tensor* {
    for (const auto& [name, t] : state)
      if (name == std::to_string(i) + "." + what) return &t;
    return nullptr;  // not allocated yet: zeros
  };
  for (const Tensor& p : model.parameters()) {
    std::size_t i = 0;
    while (i < params.size() && params[i].impl() != p.impl()) ++i;
    if (i == params.size()) throw std::invalid_argument("ReferenceOptimizer: a parameter the optimizer does not step");
    const auto n = static_cast<std::size_t>(p.numel());
    weight_decay_.insert(weight_decay_.end(), n, settings_.weight_decay[i]);
    for (auto [values, name] : {std::pair{&first_, settings_.name == "sgd" ? "momentum" : "exp_avg"},
                                std::pair{&second_, "exp_avg_sq"}}) {
      const Tensor* saved = state_of(i, name);
      const std::vector<float> held = saved ? saved->to_host() : std::vector<float>(n, 0.0f);
      values->insert(values->end(), held.begin(), held.end());
    }
  }
}

void ReferenceOptimizer::step(std::vector<float>& params, const std::vector<float>& grads, float lr) {
  using namespace rn;
  ++steps_;
  if (settings_.name == "sgd") {
    for (std::size_t k = 0; k < params.size(); ++k) {
      const float g = add(grads[k], mul(weight_decay_[k], params[k]));  // L2 decay into the gradient
      first_[k] = add(mul(settings_.momentum, first_[k]), g);            // v <- mu v + g
      params[k] = sub(params[k], mul(lr, first_[k]));                    // p <- p - lr v
    }
    return;
  }
  const bool decoupled = settings_.name == "adamw";
  const float b1 = settings_.beta1, b2 = settings_.beta2;
  // The bias corrections 1 - beta^t, from the update's own count t.
  const auto c1 = static_cast<float>(1.0 - std::pow(static_cast<double>(b1), steps_));
  const auto c2 = static_cast<float>(1.0 - std::pow(static_cast<double>(b2), steps_));
  for (std::size_t k = 0; k < params.size(); ++k) {
    float p = params[k], g = grads[k];
    if (decoupled) p = sub(p, mul(mul(lr, weight_decay_[k]), p));  // AdamW: theta <- theta - lr lambda theta
    else g = add(g, mul(weight_decay_[k], p));                       // Adam: g <- g + lambda theta
    first_[k] = add(mul(b1, first_[k]), mul(sub(1.0f, b1), g));          // m <- b1 m + (1 - b1) g
    second_[k] = add(mul(b2, second_[k]), mul(mul(sub(1.0f, b2), g), g));  // v <- b2 v + (1 - b2) g^2
    const float m_hat = div(first_[k], c1), v_hat = div(second_[k], c2);
    params[k] = sub(p, div(mul(lr, m_hat), add(rn::sqrt(v_hat), settings_.eps)));  // theta - lr m^ / (sqrt v^ + eps)
  }
}

}  // namespace course::verify
