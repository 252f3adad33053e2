// The autocast table and scope.
#include "common/ops/autocast.h"

#include <algorithm>
#include <array>
#include <utility>

#include "common/ops/ops.h"

namespace course {
namespace {

thread_local DType scope_dtype = DType::float32;
thread_local const EmulatedSixteenBits* emulation = nullptr;

// Each op and its policy, with the list PyTorch keeps it in (autocast_mode.cpp, CUDA):
//   lower_precision_fp: mm / matmul, linear, addmm, bmm, baddbmm, _scaled_dot_product_attention (the
//                       fused attention), conv*, prelu, ...
//   fp32:               softmax, log_softmax, layer_norm, group_norm, nll_loss, cross_entropy (via
//                       nll_loss and log_softmax), mse_loss, sum, prod, cumsum, exp, log, pow, norm, ...
// embedding, gelu, relu, dropout, add and mul are in neither list: they run in their inputs' type.
constexpr std::array<std::pair<std::string_view, CastPolicy>, 9> kAutocastTable{{
    {"matmul", CastPolicy::lower_precision},
    {"linear", CastPolicy::lower_precision},
    {"bmm", CastPolicy::lower_precision},
    {"attention", CastPolicy::lower_precision},
    {"softmax", CastPolicy::float32},
    {"layer_norm", CastPolicy::float32},
    {"cross_entropy", CastPolicy::float32},
    {"sum", CastPolicy::float32},
    {"mse_loss", CastPolicy::float32},
}};

}  // namespace

CastPolicy autocast_policy(std::string_view op) {
  const auto* entry = std::find_if(kAutocastTable.begin(), kAutocastTable.end(),
                                   [&](const auto& e) { return e.first == op; });
  return entry == kAutocastTable.end() ? CastPolicy::promote : entry->second;
}

Autocast::Autocast(DType dtype, bool enabled) : previous_(scope_dtype) {
  scope_dtype = enabled ? dtype : DType::float32;
}
Autocast::~Autocast() { scope_dtype = previous_; }

DType autocast_dtype() { return scope_dtype; }

// A float32 value rounded to the scope's 16-bit type and widened again, as a float32 tensor; its gradient
// goes back through the same casts, rounded to 16 bits on the way (EmulatedSixteenBits).
Tensor emulated_rounding(const Tensor& value) {
  Tensor source = value;
  if (emulation->perturb_) source = add(value, sub(emulation->perturb_(value.detach()), value.detach()));
  return cast(cast(source, scope_dtype), DType::float32);
}

EmulatedSixteenBits::EmulatedSixteenBits(std::function<Tensor(const Tensor&)> perturb)
    : previous_(emulation), perturb_(std::move(perturb)) {
  emulation = this;
}
EmulatedSixteenBits::~EmulatedSixteenBits() { emulation = previous_; }
const EmulatedSixteenBits* EmulatedSixteenBits::current() { return emulation; }

DType emulated_kept_type() { return emulation ? scope_dtype : DType::float32; }

void round_kept(Tensor& kept, DType type) {
  if (type != DType::float32 && kept.defined()) kept.copy_from(rounded_to(kept, type));
}

Tensor through_sixteen_bits(const Tensor& x, const std::function<Tensor(const Tensor&)>& f) {
  if (!emulation || scope_dtype == DType::float32 || !x.defined()) return f(x);
  return cast(f(cast(x, scope_dtype)), DType::float32);
}

Tensor rounded_to(const Tensor& value, DType type) {
  if (type == DType::float32 || !value.defined()) return value;
  return value.to(type).to(DType::float32);
}

Tensor autocast_output(std::string_view op, const Tensor& output) {
  if (!emulation || scope_dtype == DType::float32 || !output.defined()) return output;
  return autocast_policy(op) == CastPolicy::lower_precision ? emulated_rounding(output) : output;
}

Tensor autocast_input(std::string_view op, const Tensor& input) {
  if (scope_dtype == DType::float32 || !input.defined()) return input;
  switch (autocast_policy(op)) {
    case CastPolicy::lower_precision: return emulation ? emulated_rounding(cast(input, DType::float32)) : cast(input, scope_dtype);
    case CastPolicy::float32: return cast(input, DType::float32);
    case CastPolicy::promote: break;
  }
  return input;
}

}  // namespace course
