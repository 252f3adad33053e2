// Bugs of the 16-bit kernels, made on purpose (--fault truncating-gelu, ce-next-row): the kind of mistake
// that a run and a reference sharing the kernels both make, which only a reference without them sees
// (verify/lockstep.h's check_emulated). They act in the whole process, as a real kernel bug would, from
// the fault's step (common/faults/faults.h); the ops call them on their 16-bit paths only.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "common/kernels/kernels.h"
#include "common/tensor/tensor.h"

namespace course {

// --fault truncating-gelu: a 16-bit GELU (tanh form) whose results, forward and backward, are rounded
// toward zero instead of to nearest. When the fault acts, overwrites `out` (16 bits, as `a`) with
// gelu(a), or with gelu'(a) g when `g` is given, each computed in float32 and truncated; else does nothing.
void truncating_gelu_fault(UnaryOp op, const Tensor& a, const Tensor& g, Tensor& out);

// --fault ce-next-row: the 16-bit cross-entropy's backward reads each row's target from the next row
// (the last row's from the first). The targets the backward is to read: `targets` itself, or so shifted.
Tensor ce_next_row_fault(const Tensor& targets);

// For a chapter's --fault: each fault and what it breaks; and a UsageError naming --fault when `fault` is
// one of them and the run has no such kernel (not the GPT, or not in 16 bits).
std::pair<std::string, std::string> truncating_gelu_flag();
std::pair<std::string, std::string> ce_next_row_flag();
void refuse_inert_kernel_fault(const std::string& fault, bool gpt, DType precision);

}  // namespace course
