// The schedules' closed forms.
#include "common/optim/lr_scheduler.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace course::optim {

LinearLR::LinearLR(float base_lr, float start_factor, float end_factor, std::int64_t total_iters)
    : base_(base_lr), start_(start_factor), end_(end_factor), total_(total_iters) {
  if (total_iters < 0) throw std::invalid_argument("LinearLR: total_iters " + std::to_string(total_iters));
}

float LinearLR::lr_at(std::int64_t step) const {
  if (total_ == 0) return base_ * end_;
  const double t = static_cast<double>(std::clamp<std::int64_t>(step, 0, total_)) / static_cast<double>(total_);
  return static_cast<float>(base_ * (start_ + (end_ - start_) * t));
}

CosineAnnealingLR::CosineAnnealingLR(float base_lr, std::int64_t t_max, float eta_min)
    : base_(base_lr), eta_min_(eta_min), t_max_(t_max) {
  if (t_max < 1) throw std::invalid_argument("CosineAnnealingLR: T_max " + std::to_string(t_max));
}

float CosineAnnealingLR::lr_at(std::int64_t step) const {
  const double t = static_cast<double>(std::clamp<std::int64_t>(step, 0, t_max_)) / static_cast<double>(t_max_);
  return static_cast<float>(eta_min_ + (base_ - eta_min_) * (1.0 + std::cos(M_PI * t)) / 2.0);
}

SequentialLR::SequentialLR(std::vector<std::shared_ptr<LRScheduler>> schedulers, std::vector<std::int64_t> milestones)
    : schedulers_(std::move(schedulers)), milestones_(std::move(milestones)) {
  if (schedulers_.empty() || milestones_.size() + 1 != schedulers_.size() ||
      !std::is_sorted(milestones_.begin(), milestones_.end()))
    throw std::invalid_argument("SequentialLR: needs one milestone fewer than schedulers, in order");
}

float SequentialLR::lr_at(std::int64_t step) const {
  std::size_t i = 0;
  while (i < milestones_.size() && step >= milestones_[i]) ++i;
  return schedulers_[i]->lr_at(i == 0 ? step : step - milestones_[i - 1]);
}

std::shared_ptr<LRScheduler> warmup_cosine(float base_lr, std::int64_t warmup, std::int64_t total, float min_lr) {
  if (warmup < 0 || total <= warmup)
    throw std::invalid_argument("warm-up of " + std::to_string(warmup) + " steps in " + std::to_string(total));
  auto decay = std::make_shared<CosineAnnealingLR>(base_lr, total - warmup, min_lr);
  if (warmup == 0) return decay;
  return std::make_shared<SequentialLR>(
      std::vector<std::shared_ptr<LRScheduler>>{
          std::make_shared<LinearLR>(base_lr, 1.0f / static_cast<float>(warmup), 1.0f, warmup), decay},
      std::vector<std::int64_t>{warmup});
}

}  // namespace course::optim
