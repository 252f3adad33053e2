// The training recipes.
#include "common/optim/recipe.h"

#include <algorithm>
#include <stdexcept>

namespace course::optim {

Recipe::Recipe(const std::string& name, const std::vector<Tensor>& params, float lr, std::int64_t total_steps) {
  if (name == "sgd") {
    optimizer_ = std::make_unique<SGD>(params, lr);
  } else if (name == "adam") {
    optimizer_ = std::make_unique<Adam>(params, lr);
  } else if (name == "adamw") {
    optimizer_ = std::make_unique<Adam>(weight_decay_groups(params, 0.1f), lr, 0.9f, 0.95f, 1e-8f, true);
    const std::int64_t warmup = std::min<std::int64_t>(100, total_steps / 10);
    if (total_steps > warmup) schedule_ = warmup_cosine(lr, warmup, total_steps, lr / 10);
    clip_ = 1.0;
  } else {
    throw std::invalid_argument("unknown training recipe '" + name + "' (sgd, adam or adamw)");
  }
}

double Recipe::step(std::int64_t step) {
  const double norm = clip_ > 0 ? clip_grad_norm_(optimizer_->params(), clip_) : 0.0;
  update(step);
  return norm;
}

void Recipe::update(std::int64_t step) {
  if (schedule_) optimizer_->set_lr(schedule_->lr_at(step));
  optimizer_->step();
  optimizer_->zero_grad();
}

}  // namespace course::optim
