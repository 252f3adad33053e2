// The autocast table and scope.
#include "common/ops/autocast.h"

#include <algorithm>
#include <array>
#include <utility>

#include "common/ops/ops.h"

namespace course {
namespace {

thread_local DType scope_dtype = DType::float32;

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

Tensor autocast_input(std::string_view op, const Tensor& input) {
  if (scope_dtype == DType::float32 || !input.defined()) return input;
  switch (autocast_policy(op)) {
    case CastPolicy::lower_precision: return cast(input, scope_dtype);
    case CastPolicy::float32: return cast(input, DType::float32);
    case CastPolicy::promote: break;
  }
  return input;
}

}  // namespace course
