// Names and promotion of the element types.
#include "common/core/dtype.h"

#include <stdexcept>

namespace course {

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::float32: return "float32";
    case DType::bfloat16: return "bfloat16";
    case DType::float16: return "float16";
  }
  return "?";
}

const char* safetensors_dtype_name(DType dtype) {
  switch (dtype) {
    case DType::float32: return "F32";
    case DType::bfloat16: return "BF16";
    case DType::float16: return "F16";
  }
  return "?";
}

bool dtype_from_safetensors(const std::string& name, DType* dtype) {
  for (DType d : {DType::float32, DType::bfloat16, DType::float16})
    if (name == safetensors_dtype_name(d)) {
      *dtype = d;
      return true;
    }
  return false;
}

HalfFormat half_format(DType dtype) {
  if (dtype == DType::float32) throw std::logic_error("half_format: float32 is not a 16-bit format");
  return dtype == DType::bfloat16 ? HalfFormat::bfloat16 : HalfFormat::float16;
}

DType promote_types(DType a, DType b) { return a == b ? a : DType::float32; }

}  // namespace course
