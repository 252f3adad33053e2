// 16-bit floating point, as bits: IEEE half (fp16: 5 exponent bits, 10 mantissa bits, unit roundoff
// 2^-11, largest 65504) and bfloat16 (bf16: float32's 8 exponent bits, 7 mantissa bits, unit roundoff
// 2^-8). Conversions round to nearest, ties to even, like the hardware's; written once here for the
// CPU and CUDA kernels alike, so both give the same bits.
#pragma once
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "common/kernels/math.h"

namespace course::half {

using math::bits_of;
using math::float_of;

// Rounds the low `shift` bits of `value` away, to nearest and ties to even.
COURSE_HOST_DEVICE inline std::uint32_t round_shift(std::uint32_t value, int shift) {
  const std::uint32_t kept = value >> shift, rest = value & ((1u << shift) - 1), half = 1u << (shift - 1);
  return kept + ((rest > half || (rest == half && (kept & 1u))) ? 1u : 0u);
}

COURSE_HOST_DEVICE inline std::uint16_t to_bfloat16(float f) {
  const std::uint32_t u = bits_of(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40u);  // NaN stays NaN
  return static_cast<std::uint16_t>(round_shift(u, 16));  // a carry into the exponent is the right rounding
}

COURSE_HOST_DEVICE inline float from_bfloat16(std::uint16_t h) { return float_of(static_cast<std::uint32_t>(h) << 16); }

COURSE_HOST_DEVICE inline std::uint16_t to_float16(float f) {
  const std::uint32_t u = bits_of(f), sign = (u >> 16) & 0x8000u, a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return static_cast<std::uint16_t>(sign | 0x7E00u);  // NaN
  if (a >= 0x477FF000u) return static_cast<std::uint16_t>(sign | 0x7C00u); // 65520 and above round to infinity
  const int exponent = static_cast<int>(a >> 23);
  if (exponent < 113) {  // below 2^-14: a subnormal half, in units of 2^-24
    if (exponent < 102) return static_cast<std::uint16_t>(sign);  // below 2^-25: rounds to zero
    const std::uint32_t mantissa = (a & 0x7FFFFFu) | 0x800000u;
    return static_cast<std::uint16_t>(sign | round_shift(mantissa, 126 - exponent));
  }
  // A normal half: rebias the exponent (127 -> 15) and round 23 mantissa bits to 10; a carry may
  // roll into the exponent, which is again the right answer.
  return static_cast<std::uint16_t>(sign | round_shift(a - (112u << 23), 13));
}

COURSE_HOST_DEVICE inline float from_float16(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  std::uint32_t exponent = (h >> 10) & 0x1Fu, mantissa = h & 0x3FFu;
  if (exponent == 0x1F) return float_of(sign | 0x7F800000u | (mantissa << 13));  // infinity, NaN
  if (exponent == 0) {
    if (mantissa == 0) return float_of(sign);
    int e = -14;  // a subnormal: normalise it
    while (!(mantissa & 0x400u)) {
      mantissa <<= 1;
      --e;
    }
    return float_of(sign | (static_cast<std::uint32_t>(e + 127) << 23) | ((mantissa & 0x3FFu) << 13));
  }
  return float_of(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

// The format as a compile-time constant, so that a loop over 16-bit values has no branch per element.
template <HalfFormat F>
COURSE_HOST_DEVICE inline float widen(std::uint16_t h) {
  if constexpr (F == HalfFormat::bfloat16) return from_bfloat16(h);
  else return from_float16(h);
}
template <HalfFormat F>
COURSE_HOST_DEVICE inline std::uint16_t narrow(float f) {
  if constexpr (F == HalfFormat::bfloat16) return to_bfloat16(f);
  else return to_float16(f);
}

// f(std::integral_constant<HalfFormat, F>{}) for the run-time `format`.
template <class Body>
decltype(auto) with_format(HalfFormat format, Body f) {
  if (format == HalfFormat::bfloat16) return f(std::integral_constant<HalfFormat, HalfFormat::bfloat16>{});
  return f(std::integral_constant<HalfFormat, HalfFormat::float16>{});
}

// A row of 16-bit values seen as floats, for the row formulas written over float rows (rows.h): In
// reads row[i] exactly; Out stores row[i] = value rounded once to nearest even, as a float32 result's
// cast would round it. So a 16-bit kernel runs the float32 kernel's arithmetic on the exact widening of
// its input, without a float32 copy of the input or of the output.
// Both move as pointers do (view + n: the row n values further), so a kernel written over float
// pointers takes them as they are (FlashAttention's, cuda_flash_attention.cu).
template <HalfFormat F>
struct In {
  const std::uint16_t* bits;
  COURSE_HOST_DEVICE float operator[](std::int64_t i) const { return widen<F>(bits[i]); }
  COURSE_HOST_DEVICE In operator+(std::int64_t n) const { return {bits + n}; }
};
template <HalfFormat F>
struct Out {
  std::uint16_t* bits;
  struct Slot {
    std::uint16_t* at;
    COURSE_HOST_DEVICE void operator=(float value) const { *at = narrow<F>(value); }
  };
  COURSE_HOST_DEVICE Slot operator[](std::int64_t i) const { return {bits + i}; }
  COURSE_HOST_DEVICE Out operator+(std::int64_t n) const { return {bits + n}; }
};

}  // namespace course::half
