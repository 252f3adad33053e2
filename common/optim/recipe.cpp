// The training recipes.
#include "common/optim/recipe.h"


#include <algorithm>
#include <stdexcept>

namespace course::optim {

namespace {
GradScalerOptions scaling_for(DType precision, float init_scale) {
  GradScalerOptions options;
  options.enabled = precision == DType::float16;
  options.init_scale = init_scale;
  return options;
}
}  // namespace

Recipe::Recipe(const std::vector<Tensor>& params, const RecipeOptions& options, comm::Communicator* group)
    : options_(options), scaler_(scaling_for(options.precision, options.loss_scale), group) {
  const std::string& name = options.name;
  const float lr = options.lr;
  const std::int64_t total_steps = options.total_steps;
  if (name == "sgd") {
    optimizer_ = std::make_unique<SGD>(params, lr);
  } else if (name == "adam") {
    optimizer_ = std::make_unique<Adam>(params, lr);
  } else if (name == "adamw") {
    const AdamWSettings& a = kGpt2AdamW;
    optimizer_ = std::make_unique<Adam>(weight_decay_groups(params, a.weight_decay), lr, a.beta1, a.beta2, a.eps, true);
    const std::int64_t warmup = std::min<std::int64_t>(100, total_steps / 10);
    if (total_steps > warmup) schedule_ = warmup_cosine(lr, warmup, total_steps, lr / 10);
    clip_ = a.max_grad_norm;
  } else {
    throw std::invalid_argument("unknown training recipe '" + name + "' (sgd, adam or adamw)");
  }
}

float Recipe::reference_backward(const std::vector<Tensor>& params, const std::function<Tensor()>& loss) const {
  const Tensor value = forward_backward(loss);
  scaler_.unscale_gradients(params);
  return value.item();
}

void Recipe::unscale_() {
  if (scaler_.is_enabled() && !scaler_.unscaled()) scaler_.unscale_(*optimizer_);
}

Tensor Recipe::step(std::int64_t step) {
  return this->step(step, [this] { return clip_ > 0 ? clip_grad_norm_(optimizer_->params(), clip_) : Tensor(); });
}

Tensor Recipe::step(std::int64_t step, const std::function<Tensor()>& clip) {
  unscale_();
  skipped_ = scaler_.found_inf();
  if (skipped_) {  // torch.amp's skipped step: no update, the scale halved; the schedule moves on
    scaler_.step(*optimizer_);  // counts the skip, does not step
    optimizer_->zero_grad();
    scaler_.update();
    return Tensor();
  }
  const Tensor norm = clip();
  update(step);
  scaler_.update();
  return norm;
}

double norm_value(const Tensor& norm) { return norm.defined() ? static_cast<double>(norm.item()) : 0.0; }

void Recipe::update(std::int64_t step) {
  if (schedule_) optimizer_->set_lr(schedule_->lr_at(step));
  optimizer_->step_and_zero_grad();
}

}  // namespace course::optim
