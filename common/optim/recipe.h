// How a model is trained, as one object: the optimizer, its learning-rate schedule and gradient
// clipping. Chapters name a recipe (--optimizer) instead of assembling the three by hand, so that the
// same name trains the same way in every chapter.
//   sgd:   plain SGD at a constant rate (chapters 01-04's lesson).
//   adam:  Adam at a constant rate (Kingma & Ba, 2015).
//   adamw: what GPT-2 and nanoGPT train with: AdamW (betas 0.9, 0.95; weight decay 0.1 on matrices and
//          embeddings only), linear warm-up over a tenth of the run (at most 100 steps) then cosine
//          decay to lr/10, and the gradient clipped to norm 1 (after the DDP average).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/optim/lr_scheduler.h"
#include "common/optim/optimizer.h"

namespace course::optim {

class Recipe {
 public:
  // Throws std::invalid_argument for a name other than sgd, adam or adamw.
  Recipe(const std::string& name, const std::vector<Tensor>& params, float lr, std::int64_t total_steps);

  // After backward (and after the gradients are averaged): clip, then update(step). Returns the
  // gradients' norm before clipping (0 when the recipe does not clip).
  double step(std::int64_t step);
  // Set the rate of `step` (counted from 0 over the whole run, so a resumed run continues the
  // schedule), update, clear the gradients: the step without clipping, for a caller that has clipped
  // (the lock-step reference repeats the run's update with the run's own clipping).
  void update(std::int64_t step);

  Optimizer& optimizer() { return *optimizer_; }
  const Optimizer& optimizer() const { return *optimizer_; }
  double clip() const { return clip_; }

 private:
  std::unique_ptr<Optimizer> optimizer_;
  std::shared_ptr<LRScheduler> schedule_;  // null: a constant rate
  double clip_ = 0.0;                      // 0: no clipping
};

}  // namespace course::optim
