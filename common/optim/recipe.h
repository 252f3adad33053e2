// How a model is trained, as one object: the optimizer, its learning-rate schedule and gradient
// clipping. Chapters name a recipe (--optimizer) instead of assembling the three by hand, so that the
// same name trains the same way in every chapter.
//   sgd:   plain SGD at a constant rate (chapters 01-04's lesson).
//   adam:  Adam at a constant rate (Kingma & Ba, 2015).
//   adamw: what GPT-2 and nanoGPT train with: AdamW (betas 0.9, 0.95; weight decay 0.1 on matrices and
//          embeddings only), linear warm-up over a tenth of the run (at most 100 steps) then cosine
//          decay to lr/10, and the gradient clipped to norm 1 (after the DDP average).
// A recipe also carries the run's precision (--precision): in float16 a GradScaler (grad_scaler.h) scales
// the loss before backward and the gradients back before clipping, and skips a step whose gradients
// overflowed; in bfloat16 and float32 it has nothing to do (bfloat16 keeps float32's range).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/core/dtype.h"
#include "common/optim/grad_scaler.h"
#include "common/optim/lr_scheduler.h"
#include "common/optim/mixed_precision.h"
#include "common/optim/optimizer.h"

namespace course::optim {

// GPT-2's AdamW (as nanoGPT trains it), one home for its numbers: the adamw recipe uses them, and so
// does chapter 07's ZeRO optimizer, which runs the same update on shards.
struct AdamWSettings {
  float beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0.1f;
  double max_grad_norm = 1.0;
};
inline constexpr AdamWSettings kGpt2AdamW{};

// A recipe by name, as a chapter's flags give it:
//   optim::Recipe training(model.parameters(), {.name = "adamw", .lr = 6e-4f, .total_steps = 1000});
struct RecipeOptions {
  std::string name = "sgd";          // sgd, adam or adamw (--optimizer)
  float lr = 1e-3f;                  // the peak rate (--lr)
  std::int64_t total_steps = 1;      // the run's length, which adamw's schedule spans (--steps)
  DType precision = DType::float32;  // the type autocast computes in (--precision); float16 scales the loss
  float loss_scale = 65536.0f;       // float16's first loss scale (--loss-scale)
};

class Recipe {
 public:
  // Throws std::invalid_argument for a name other than sgd, adam or adamw. In float16 the inf/NaN check
  // of the gradients is agreed over `group` (the ranks whose gradients are averaged).
  Recipe(const std::vector<Tensor>& params, const RecipeOptions& options, comm::Communicator* group = nullptr);

  // Forward and backward in the recipe's precision, so that a training loop reads forward-backward, step:
  // `forward` runs under autocast (off in float32) and returns the loss; backward starts from it times
  // the loss scale (float16), or from the loss itself. Returns the loss. The steps inside are the ones
  // chapter 04 writes out, where mixed precision is taught.
  Tensor forward_backward(const std::function<Tensor()>& forward) const { return mixed_.forward_backward(forward); }
  // What backward starts from: the loss times the loss scale (float16), or the loss itself. Chapter 04's
  // loop, where mixed precision is taught, writes the steps out with it.
  Tensor scale_loss(const Tensor& loss) const { return scaler_.scale(loss); }
  // The two halves apart (mixed_precision.h), for a loop that times them or a pipeline that interleaves
  // them: forward under autocast, backward from the scaled loss.
  const MixedPrecision& mixed_precision() const { return mixed_; }
  // float16: divides the gradients by the loss scale and finds whether any is inf or NaN (on any rank of
  // the group); nothing otherwise. After the gradients are averaged, before they are checked or clipped;
  // step() calls it if the chapter has not.
  void unscale_();
  // After backward (and after the gradients are averaged): clip, then update(step). Returns the
  // gradients' norm before clipping as clip_grad_norm_ does, one float32 where the gradients are, so that
  // the step waits for nothing (norm_value reads it); undefined when the recipe does not clip or the step
  // was skipped. In float16 a step whose gradients are not finite is skipped (the gradients cleared, the
  // scale backed off; skipped() says so).
  Tensor step(std::int64_t step);
  // The same for gradients that no one rank holds whole (chapter 08's grid): `clip` clips them, however
  // they are spread, and returns their norm; it is called only when the step is taken.
  Tensor step(std::int64_t step, const std::function<Tensor()>& clip);
  bool skipped() const { return skipped_; }
  // One part of a step as the run computes it, for a lock-step reference: `loss` evaluated under the
  // recipe's autocast, backward from it times the run's loss scale, then `params`' gradients divided by
  // that scale again (the run divides the sum once; the scale is a power of two, so the bits agree).
  // Returns the loss.
  float reference_backward(const std::vector<Tensor>& params, const std::function<Tensor()>& loss) const;
  const GradScaler& scaler() const { return scaler_; }
  void load_scaler_state(const GradScalerState& state) { scaler_.load_state(state); }
  DType precision() const { return options_.precision; }
  const RecipeOptions& options() const { return options_; }
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
  RecipeOptions options_;
  GradScaler scaler_;
  MixedPrecision mixed_{options_.precision, scaler_};
  bool skipped_ = false;
};

// A norm that step() returned, as a number: read from where it lies, or 0 for a step that did not clip.
double norm_value(const Tensor& norm);

}  // namespace course::optim
