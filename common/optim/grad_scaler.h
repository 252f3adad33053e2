// Dynamic loss scaling for float16 training (Micikevicius et al., "Mixed Precision Training", 2018), with
// torch.amp.GradScaler's semantics and defaults: the loss is multiplied by the scale before backward, so
// that small gradients do not flush to zero in float16; the gradients are divided by it again before
// clipping and the optimizer step (unscale_); a step whose gradients hold an inf or a NaN is skipped and
// the scale halved (backoff_factor); after growth_interval clean steps in a row the scale doubles.
// bfloat16 has float32's range and needs none of it. With a group, the check for inf/NaN is one
// all-reduce over its ranks, so every rank skips the same steps.
//
// Ours differs from PyTorch's in serving one optimizer (PyTorch's keeps a record per optimizer).
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "common/comm/communicator.h"
#include "common/optim/optimizer.h"

namespace course::optim {

// What a checkpoint keeps of a scaler (torch.amp.GradScaler's state_dict): its scale, the clean steps
// since the scale last changed, and the steps it skipped (the optimizer took that many fewer). A scale of
// 0 stands for no scaler (disabled).
struct GradScalerState {
  float scale = 0.0f;
  std::int64_t growth_tracker = 0;
  std::int64_t skipped = 0;
};

struct GradScalerOptions {
  float init_scale = 65536.0f;  // 2^16
  float growth_factor = 2.0f;
  float backoff_factor = 0.5f;
  std::int64_t growth_interval = 2000;
  bool enabled = true;  // disabled: scale() and unscale_() pass through, step() always steps
};

// Hears, while alive on this thread (the innermost one), every division of gradients by a loss scale
// (GradScaler::unscale_gradients): the event a record of the gradients' terms subscribes to, so that what
// it recorded follows them (verify/contribution_magnitudes.h).
class UnscaleListener {
 public:
  UnscaleListener();
  virtual ~UnscaleListener();
  UnscaleListener(const UnscaleListener&) = delete;
  UnscaleListener& operator=(const UnscaleListener&) = delete;
  static UnscaleListener* current();  // this thread's innermost, or null
  // The gradients of `params` were multiplied by `factor` (the loss scale undone).
  virtual void unscaled(const std::vector<Tensor>& params, double factor) = 0;

 private:
  UnscaleListener* previous_;
};

class GradScaler {
 public:
  explicit GradScaler(GradScalerOptions options = {}, comm::Communicator* group = nullptr);

  Tensor scale(const Tensor& loss) const;  // loss times the current scale (differentiable)
  // Divides every gradient of `optimizer` by the scale, in place, and records whether any is inf or NaN
  // (on any rank of the group). Once per step: a second call before update() throws std::logic_error.
  void unscale_(Optimizer& optimizer);
  // The same for gradients that no optim::Optimizer holds (ZeRO's shards): divides each of `gradients`
  // (float32) in place.
  void unscale_(const std::vector<Tensor>& gradients);
  // optimizer.step() unless the unscaled gradients were not finite (unscale_ first if it was not called).
  // Returns whether the optimizer stepped.
  bool step(Optimizer& optimizer);
  // The same for an update that is not an optim::Optimizer's: runs `update` unless the gradients
  // unscale_ saw were not finite (unscale_ must have been called); returns whether it ran.
  bool step(const std::function<void()>& update);
  // The scale for the next step: backed off after a skipped step, grown after growth_interval clean ones.
  void update();

  float get_scale() const { return options_.enabled ? scale_ : 1.0f; }
  GradScalerState state() const {
    return options_.enabled ? GradScalerState{scale_, growth_tracker_, skipped_} : GradScalerState{};
  }
  // Continues from a checkpoint's state (load_state_dict). Throws std::invalid_argument when the state
  // and this scaler disagree on being enabled, or the scale is not positive and finite.
  void load_state(const GradScalerState& state);
  bool unscaled() const { return unscaled_; }    // unscale_ was called this step
  bool found_inf() const { return found_inf_; }  // ... and found an inf or NaN (false before it is called)
  // Divides each of `params`' gradients by the current scale, recording nothing: a lock-step reference
  // recomputing a part of the step the run scaled. The scale is a power of two, so this gives the bits
  // the run's own unscale_ gives after its gradients are added (barring float32 overflow or underflow).
  void unscale_gradients(const std::vector<Tensor>& params) const;
  std::int64_t skipped_steps() const { return skipped_; }
  bool is_enabled() const { return options_.enabled; }

 private:
  GradScalerOptions options_;
  comm::Communicator* group_;
  float scale_;
  std::int64_t growth_tracker_ = 0, skipped_ = 0;
  bool unscaled_ = false, found_inf_ = false;
};

}  // namespace course::optim
