// The 16-bit kernels' faults (kernel_faults.h).
#include "common/ops/kernel_faults.h"

#include <cmath>
#include <vector>

#include "common/core/errors.h"
#include "common/faults/faults.h"
#include "common/kernels/half.h"
#include "common/kernels/kernels.h"

namespace course {
namespace {

// x rounded toward zero to `format` (widened again, exactly): rounded to nearest, then one step toward
// zero where that went past x.
float toward_zero(bool brain, float x) {
  std::uint16_t h = brain ? half::to_bfloat16(x) : half::to_float16(x);
  const auto widen = [brain](std::uint16_t bits) { return brain ? half::from_bfloat16(bits) : half::from_float16(bits); };
  if (std::isfinite(x) && std::fabs(widen(h)) > std::fabs(x)) --h;  // sign and magnitude: one unit toward zero
  return widen(h);
}

}  // namespace

void truncating_gelu_fault(UnaryOp op, const Tensor& a, const Tensor& g, Tensor& out) {
  // A bug of the 16-bit kernel: not in the kernels that replace it (EmulatedHalfKernels).
  if (op != UnaryOp::gelu_tanh || !faults::active("truncating-gelu") || EmulatedHalfKernels::active()) return;
  const auto x = a.to(DType::float32).to_host();
  std::vector<float> exact(x.size());
  Kernels& k = kernels(Device::cpu);
  if (g.defined())
    k.unary_backward(op, x.data(), g.to(DType::float32).to_host().data(), exact.data(), x.size());
  else
    k.unary(op, x.data(), exact.data(), x.size());
  for (float& v : exact) v = toward_zero(a.dtype() == DType::bfloat16, v);
  out.copy_from(Tensor::from_host(exact, out.shape(), out.device(), out.dtype()));  // exact: already 16-bit values
}

std::pair<std::string, std::string> truncating_gelu_flag() {
  return {"truncating-gelu", "the 16-bit GELU rounds toward zero, forward and backward (a kernel bug the reference's "
                             "16-bit parts repeat)"};
}

std::pair<std::string, std::string> ce_next_row_flag() {
  return {"ce-next-row", "the 16-bit cross-entropy's backward reads each row's target from the next row"};
}

void refuse_inert_kernel_fault(const std::string& fault, bool gpt, DType precision) {
  if ((fault == "truncating-gelu" || fault == "ce-next-row") && (!gpt || precision == DType::float32))
    throw UsageError("--fault: " + fault + " is a bug of the GPT's 16-bit kernels: add --model gpt and --precision "
                     "bf16 or fp16");
}

Tensor ce_next_row_fault(const Tensor& targets) {
  if (!faults::active("ce-next-row") || EmulatedHalfKernels::active()) return targets;
  auto t = targets.to(DType::float32).to_host();
  std::vector<float> shifted(t.size());
  for (std::size_t i = 0; i < t.size(); ++i) shifted[i] = t[(i + 1) % t.size()];
  return Tensor::from_host(shifted, targets.shape(), targets.device());
}

}  // namespace course
