// Learning-rate schedules as PyTorch's torch.optim.lr_scheduler names them, in closed form: each gives
// the learning rate at a step, so a resumed run needs only the step count. The GPT's schedule is
// linear warm-up then cosine decay (GPT-2, nanoGPT):
//   SequentialLR({LinearLR(base, 1/warmup, 1, warmup), CosineAnnealingLR(base, total - warmup, min)}, {warmup})
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

namespace course::optim {

class LRScheduler {
 public:
  virtual ~LRScheduler() = default;
  virtual float lr_at(std::int64_t step) const = 0;
};

// base * factor, the factor going linearly from start_factor to end_factor over total_iters steps.
class LinearLR : public LRScheduler {
 public:
  LinearLR(float base_lr, float start_factor, float end_factor, std::int64_t total_iters);
  float lr_at(std::int64_t step) const override;

 private:
  float base_, start_, end_;
  std::int64_t total_;
};

// eta_min + (base - eta_min) (1 + cos(pi step / T_max)) / 2, held at eta_min after T_max.
class CosineAnnealingLR : public LRScheduler {
 public:
  CosineAnnealingLR(float base_lr, std::int64_t t_max, float eta_min = 0.0f);
  float lr_at(std::int64_t step) const override;

 private:
  float base_, eta_min_;
  std::int64_t t_max_;
};

// The first schedule until milestones[0], then the next, counting its steps from its milestone.
class SequentialLR : public LRScheduler {
 public:
  SequentialLR(std::vector<std::shared_ptr<LRScheduler>> schedulers, std::vector<std::int64_t> milestones);
  float lr_at(std::int64_t step) const override;

 private:
  std::vector<std::shared_ptr<LRScheduler>> schedulers_;
  std::vector<std::int64_t> milestones_;
};

// Linear warm-up over `warmup` steps from base/warmup to base, then cosine decay to min_lr at `total`.
std::shared_ptr<LRScheduler> warmup_cosine(float base_lr, std::int64_t warmup, std::int64_t total, float min_lr);

}  // namespace course::optim
