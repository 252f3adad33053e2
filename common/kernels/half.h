// 16-bit floating point, as bits: IEEE half (fp16: 5 exponent bits, 10 mantissa bits, unit roundoff
// 2^-11, largest 65504) and bfloat16 (bf16: float32's 8 exponent bits, 7 mantissa bits, unit roundoff
// 2^-8). Conversions round to nearest, ties to even, like the hardware's; written once here for the
// CPU and CUDA kernels alike, so both give the same bits.
//
// A NaN narrows to one quiet NaN of each format, with no sign or payload (bf16 0x7FC0, as c10's
// round_to_nearest_even; fp16 0x7E00): the GPU's float arithmetic returns its one canonical NaN
// (0x7FFFFFFF) whatever its operands, x86's returns the first operand's payload and sign, so a NaN's
// sign and payload are the one part of a result that the two devices' arithmetic cannot agree on.
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
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FC0u;  // NaN: the canonical quiet NaN
  return static_cast<std::uint16_t>(round_shift(u, 16));  // a carry into the exponent is the right rounding
}

COURSE_HOST_DEVICE inline float from_bfloat16(std::uint16_t h) { return float_of(static_cast<std::uint32_t>(h) << 16); }

// Both fp16 conversions compute every case and select one, without a branch or a loop per value, so
// that a warp does not diverge and the CPU's loops over them run as fast as bf16's shifts (the same
// results as the case-by-case definitions for every one of the 2^32 floats and 2^16 halves: tests/half_test).
COURSE_HOST_DEVICE inline std::uint16_t to_float16(float f) {
  const std::uint32_t u = bits_of(f), sign = (u >> 16) & 0x8000u, a = u & 0x7FFFFFFFu;
  // A normal half (2^-14 and up): rebias the exponent (127 -> 15) and round 23 mantissa bits to 10, to
  // nearest and ties to even; a carry may roll into the exponent, which is again the right answer.
  const std::uint32_t rebiased = a - (112u << 23);
  const std::uint32_t normal = (rebiased + 0xFFFu + ((rebiased >> 13) & 1u)) >> 13;
  // Below 2^-14, a subnormal half counts units of 2^-24: 0.5 + |f| rounds |f| to a whole number of them
  // (0.5's unit in the last place is 2^-24), and the count is that sum's bits past 0.5's; 2^-14 itself,
  // reached by rounding up, is the smallest normal half's encoding, 0x400.
  const std::uint32_t subnormal = bits_of(rn::add(float_of(a), 0.5f)) - bits_of(0.5f);
  const std::uint32_t bits = a >= 0x477FF000u ? 0x7C00u  // 65520 and above round to infinity
                             : a >= (113u << 23) ? normal
                                                 : subnormal;
  return static_cast<std::uint16_t>(a > 0x7F800000u ? 0x7E00u : sign | bits);  // NaN: the canonical quiet NaN
}

COURSE_HOST_DEVICE inline float from_float16(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16, em = h & 0x7FFFu;
  // A subnormal half (exponent bits 0) is its 10-bit mantissa times 2^-24: exact, and a normal float.
  const float subnormal = rn::mul(static_cast<float>(static_cast<std::int32_t>(em)), 0x1p-24f);
  const std::uint32_t bits = em >= 0x7C00u   ? 0x7F800000u | ((em & 0x3FFu) << 13)  // infinity, NaN
                             : em >= 0x0400u ? (em << 13) + (112u << 23)            // rebias 15 -> 127
                                             : bits_of(subnormal);
  return float_of(sign | bits);
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
