// Element types of a tensor's storage: float32, and the two 16-bit formats that mixed-precision
// training computes in (common/kernels/half.h has their bits and roundings). Arithmetic on 16-bit
// tensors reads them into float32, computes and rounds the result once, so accumulation is always in
// float32 (as cuBLAS's CUBLAS_COMPUTE_32F and PyTorch's CPU kernels do).
#pragma once
#include <cstddef>
#include <string>

#include "common/kernels/kernels.h"

namespace course {

enum class DType { float32, bfloat16, float16 };

inline std::size_t element_size(DType dtype) { return dtype == DType::float32 ? 4 : 2; }
inline bool is_16bit(DType dtype) { return dtype != DType::float32; }
// PyTorch's names: torch.float32, torch.bfloat16, torch.float16.
const char* dtype_name(DType dtype);
// The safetensors header's names: F32, BF16, F16.
const char* safetensors_dtype_name(DType dtype);
// The type a safetensors header names ("F32", "BF16", "F16"); false for any other name.
bool dtype_from_safetensors(const std::string& name, DType* dtype);
// The 16-bit format the conversion kernels take; dtype must be a 16-bit one.
HalfFormat half_format(DType dtype);
// torch.promote_types among these three: the same type stays, float32 with anything is float32, and
// bfloat16 with float16 is float32 (neither holds the other).
DType promote_types(DType a, DType b);

}  // namespace course
