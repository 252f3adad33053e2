// Names and promotion of the element types.
#include "common/core/dtype.h"

#include <iterator>
#include <stdexcept>

namespace course {

namespace {
// Each type's names, in the enum's order: PyTorch's, and the safetensors header's.
struct Names {
  const char* torch;
  const char* safetensors;
};
constexpr Names kNames[] = {{"float32", "F32"}, {"bfloat16", "BF16"}, {"float16", "F16"}};
static_assert(std::size(kNames) == static_cast<std::size_t>(DType::float16) + 1, "a name for every type");
const Names& names_of(DType dtype) { return kNames[static_cast<int>(dtype)]; }
}  // namespace

const char* dtype_name(DType dtype) { return names_of(dtype).torch; }
const char* safetensors_dtype_name(DType dtype) { return names_of(dtype).safetensors; }

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
