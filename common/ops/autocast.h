// Autocast, as torch.autocast defines it (Micikevicius et al., "Mixed Precision Training", 2018): inside
// a scope, each op casts its floating-point inputs by one table, so the GEMMs run in 16 bits while the
// ops that need float32's range and precision (softmax, layer norm, the losses, reductions) stay in
// float32. Parameters stay float32 masters; each op that computes in 16 bits casts them at use, and the
// cast's backward widens the gradient back, so the optimizer sees float32 gradients.
//
//   {
//     Autocast autocast(DType::bfloat16);   // torch.autocast(device_type, dtype=torch.bfloat16)
//     loss = model.forward(batch);          // linear: bfloat16; layer_norm, cross_entropy: float32
//   }
//   loss.backward();                        // backward runs each op in the type its forward chose
//
// The table (kAutocastTable in autocast.cpp) lists each op beside the list PyTorch keeps it in
// (torch/csrc/autograd/autocast_mode.cpp: CUDA's lower_precision_fp and fp32 lists, which the CPU's
// follow for these ops). Ops not listed run in the widest type of their inputs (type promotion: float32
// with bfloat16 gives float32), as PyTorch's do. Ours differs in two ways: it casts a parameter at
// every use instead of caching the cast for the scope (the GPT uses each weight once per forward, so
// the count is the same), and it is one scope for both devices.
#pragma once
#include <functional>
#include <string_view>

#include "common/core/dtype.h"
#include "common/tensor/tensor.h"

namespace course {

enum class CastPolicy {
  lower_precision,  // inputs cast to the scope's 16-bit type: matmul, linear, bmm, attention
  float32,          // inputs cast to float32: softmax, layer_norm, cross_entropy, sum, mse_loss
  promote,          // no cast: the op runs in the widest type of its inputs
};

// The policy of an op by its name ("linear", "layer_norm"...); promote for one the table does not list.
CastPolicy autocast_policy(std::string_view op);

// While one is alive on this thread, ops cast their inputs by the table; DType::float32 (or enabled =
// false) turns autocast off inside it, as torch.autocast(enabled=False) does. Scopes nest.
class Autocast {
 public:
  explicit Autocast(DType dtype, bool enabled = true);
  ~Autocast();
  Autocast(const Autocast&) = delete;
  Autocast& operator=(const Autocast&) = delete;

 private:
  DType previous_;
};

// The 16-bit type of the innermost scope; float32 when autocast is off.
DType autocast_dtype();

// The input of op `op` as autocast gives it to the op: cast by the table when a scope is on (the cast
// recorded by autograd), otherwise the input itself.
Tensor autocast_input(std::string_view op, const Tensor& input);
// The output of op `op` as the rest of the computation sees it: the output itself, except while a 16-bit
// scope is emulated (below), where a lower-precision op's float32 output is rounded to the scope's type.
Tensor autocast_output(std::string_view op, const Tensor& output);

// The type in which a lower-precision op keeps for its backward what it computed (attention's
// probabilities, FlashAttention's output): the scope's 16-bit type while it is emulated (below), as the
// 16-bit path keeps them; float32 otherwise. round_kept rounds a float32 `kept` to it, in place.
DType emulated_kept_type();
void round_kept(Tensor& kept, DType type);

// A lower-precision op's output handed to code that computes on it in the 16-bit type the 16-bit path
// holds it in (a tensor-parallel collective, which rounds each partial sum): f(x), except while a 16-bit
// scope is emulated, where x is cast to that type for f (exact: its values are rounded already) and f's
// result widened back. No 16-bit kernel runs: a collective only adds and rounds.
Tensor through_sixteen_bits(const Tensor& x, const std::function<Tensor(const Tensor&)>& f);
// `value` rounded to `type` and widened again, a new float32 tensor (`value` itself when type is float32):
// what a custom op's backward computes in float32 rounded where the 16-bit path's rounds.
Tensor rounded_to(const Tensor& value, DType type);

// A 16-bit scope's arithmetic without one 16-bit kernel: while one of these is alive on this thread, an
// Autocast scope of a 16-bit type keeps every tensor float32 and rounds where the 16-bit path rounds, by
// casts there and back (bits a float32 holds exactly): a lower-precision op's inputs and its output, so
// the op runs its float32 kernel on the rounded operands, and, through the casts' backward, the gradients
// that reach them. The 16-bit element-wise kernels compute the float32 formula on the widened values and
// round once, and a 16-bit tensor's gradient is rounded to its type, so on the CPU, whose 16-bit GEMMs
// are the float32 GEMMs on the widened operands, this is the same computation in another code. (A 16-bit
// kernel that rounds wrongly, or reads the wrong row, is not in it: verify/lockstep.h's check_emulated.)
// `perturb`, when given, changes each value before it is rounded (the check's noise floor moves each by
// one float32 rounding).
class EmulatedSixteenBits {
 public:
  explicit EmulatedSixteenBits(std::function<Tensor(const Tensor&)> perturb = {});
  ~EmulatedSixteenBits();
  EmulatedSixteenBits(const EmulatedSixteenBits&) = delete;
  EmulatedSixteenBits& operator=(const EmulatedSixteenBits&) = delete;

  // The emulation alive on this thread (null: none) and its perturbation: work that a scope hands to
  // other threads (verify/model_parallel_reference.h) makes the same emulation on each of them.
  static const EmulatedSixteenBits* current();
  const std::function<Tensor(const Tensor&)>& perturbation() const { return perturb_; }

 private:
  const EmulatedSixteenBits* previous_;
  std::function<Tensor(const Tensor&)> perturb_;
  friend Tensor emulated_rounding(const Tensor& value);
};

}  // namespace course
