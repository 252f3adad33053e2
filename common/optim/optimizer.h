// Optimizers: SGD (with optional momentum) and Adam/AdamW, updating parameters in place.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "common/comm/communicator.h"
#include "common/tensor/tensor.h"

namespace course::optim {

// What an optimizer computes with, for a check that repeats its update from the papers' formulas
// (verify/reference_optimizer.h): its kind and hyperparameters, the weight decay of each parameter in
// params() order.
struct Settings {
  std::string name;  // "sgd", "adam" or "adamw"
  float momentum = 0.0f, beta1 = 0.0f, beta2 = 0.0f, eps = 0.0f;
  std::vector<float> weight_decay;
};

class Optimizer {
 public:
  explicit Optimizer(std::vector<Tensor> params, float lr);
  virtual ~Optimizer() = default;
  virtual void step() = 0;  // parameters without a gradient are left alone
  virtual std::string name() const = 0;  // "sgd", "adam", "adamw": what a checkpoint records
  virtual Settings settings() const = 0;
  void zero_grad();
  // step(), then zero_grad(): Adam clears each gradient as its update reads it, in the same launch.
  virtual void step_and_zero_grad() {
    step();
    zero_grad();
  }
  float lr() const { return lr_; }
  void set_lr(float lr) { lr_ = lr; }
  const std::vector<Tensor>& params() const { return params_; }
  // The state a checkpoint saves, as named tensors ("0.momentum", "0.exp_avg", ...), plus the step count.
  virtual std::vector<std::pair<std::string, Tensor>> state() const = 0;
  // The parameter a state() entry belongs to: "K.exp_avg" is params()[K]'s.
  const Tensor& parameter_of(const std::string& state_name) const {
    return params_.at(static_cast<std::size_t>(std::stoul(state_name.substr(0, state_name.find('.')))));
  }
  // Restores what state() returned and the step count, so the next step() is exactly the one the
  // saved run would have taken (Adam's bias correction depends on the count). Throws
  // std::invalid_argument naming the first entry that is missing, unexpected or of another shape.
  void load_state(const std::vector<std::pair<std::string, Tensor>>& state, long steps);
  long steps_taken() const { return steps_; }

 protected:
  std::vector<Tensor> params_;
  float lr_;
  long steps_ = 0;

 private:
  // The buffers state() names, allocated (zeros) if the optimizer has not stepped yet.
  virtual std::vector<std::pair<std::string, Tensor>> allocate_state() = 0;
};

class SGD : public Optimizer {
 public:
  SGD(std::vector<Tensor> params, float lr, float momentum = 0.0f, float weight_decay = 0.0f);
  void step() override;
  std::string name() const override { return "sgd"; }
  Settings settings() const override;
  std::vector<std::pair<std::string, Tensor>> state() const override;

 private:
  std::vector<std::pair<std::string, Tensor>> allocate_state() override;
  float momentum_, weight_decay_;
  std::vector<Tensor> momentum_buffers_;  // allocated on the first step, only with momentum
};

// A parameter group, as in PyTorch's optimizers: these parameters with this weight decay.
struct ParamGroup {
  std::vector<Tensor> params;
  float weight_decay = 0.0f;
};

// GPT-2's (and nanoGPT's) grouping: every tensor of two or more dimensions (the matmul weights and
// the embeddings) decays, biases and layer-norm parameters (one dimension) do not.
std::vector<ParamGroup> weight_decay_groups(const std::vector<Tensor>& params, float weight_decay);

// Adam (Kingma & Ba, 2015); with decoupled weight decay it is AdamW (Loshchilov & Hutter, 2019).
class Adam : public Optimizer {
 public:
  Adam(std::vector<Tensor> params, float lr, float beta1 = 0.9f, float beta2 = 0.999f, float eps = 1e-8f,
       float weight_decay = 0.0f, bool decoupled_weight_decay = false);
  // Parameter groups, each with its own weight decay; the parameters are ordered group by group.
  Adam(const std::vector<ParamGroup>& groups, float lr, float beta1, float beta2, float eps,
       bool decoupled_weight_decay);
  void step() override { step(false); }
  void step_and_zero_grad() override { step(true); }
  std::string name() const override { return decoupled_ ? "adamw" : "adam"; }
  Settings settings() const override;
  std::vector<std::pair<std::string, Tensor>> state() const override;

 private:
  std::vector<std::pair<std::string, Tensor>> allocate_state() override;
  void step(bool zero_grad);
  float beta1_, beta2_, eps_;
  std::vector<float> weight_decay_;  // per parameter, from its group
  bool decoupled_;
  std::vector<Tensor> exp_avg_, exp_avg_sq_;
};

inline Adam AdamW(std::vector<Tensor> params, float lr, float weight_decay = 0.01f) {
  return Adam(std::move(params), lr, 0.9f, 0.999f, 1e-8f, weight_decay, true);
}

// torch.nn.utils.clip_grad_norm_: the 2-norm of all the gradients together; when it exceeds
// max_norm, every gradient is scaled by max_norm / (norm + 1e-6). Returns the norm before clipping, as
// PyTorch does: one float32 where the gradients are, computed and applied there, so that clipping makes
// the host wait for nothing (read it with item() when it is wanted).
// Under DDP, call it after the gradients are averaged: every rank then clips identically.
Tensor clip_grad_norm_(const std::vector<Tensor>& params, double max_norm);
// The same, the one clip of the course, for gradients whole or split across ranks: `counted` are the
// gradients whose squares make up this rank's share of the norm (each element of the whole model
// counted once over the groups: a ZeRO shard, the parts a TP rank counts), summed in double and then
// added over each of `groups` in turn (none when the model is whole here); every gradient of `scaled`
// is multiplied by the same factor (clip_coefficient). Returns the norm, the same on every rank.
Tensor clip_grad_norm_(const std::vector<Tensor>& counted, const std::vector<Tensor>& scaled, double max_norm,
                       const std::vector<comm::Communicator*>& groups);
// The factor that clipping scales every gradient by, given their global norm: the norm rounded to
// float32 (as PyTorch's), then max_norm / (norm + 1e-6) in double, rounded to float32, when the norm
// exceeds max_norm, else 1 (no scaling): math::clip_coefficient, the one rule of every clip in the course,
// whole or over shards (ZeRO, the TP x PP grid), and of the lock-step reference that repeats the run's update.
float clip_coefficient(double norm, double max_norm);

}  // namespace course::optim
