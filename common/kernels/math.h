// Scalar formulas shared by the CPU and CUDA kernels, so both compute the same expression, and in
// explicitly rounded operations (rounded.h: rn::mul, rn::add, ...), so both compute the same bits.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

#include "common/kernels/kernels.h"
#include "common/kernels/rounded.h"
#include "common/tensor/random.h"

namespace course::math {

// GELU (Hendrycks & Gimpel, "Gaussian Error Linear Units", 2016): exactly x * Phi(x), Phi the standard
// normal's distribution function, and the paper's tanh approximation, which GPT-2 was trained with.
constexpr float kSqrtHalf = 0.7071067811865476f;     // 1/sqrt(2)
constexpr float kInvSqrt2Pi = 0.3989422804014327f;   // 1/sqrt(2 pi)

constexpr float kGeluC = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kGeluA = 0.044715f;
constexpr float kGelu3A = 3.0f * kGeluA;       // rounded once, at compile time, on both devices

// e^x in float from arithmetic alone, so a loop of it vectorises (a call to expf does not), and both
// devices run the same instructions. The textbook method: x = n ln2 + r with n an integer and
// |r| <= ln2 / 2 (Cody and Waite's two-part ln2, so n ln2 is exact), e^r by its Taylor series to r^7
// (the next term is below 6e-9, under half a float ulp), and 2^n put straight into exponent bits, in two
// halves so that n up to 128 fits. Within 2 ulp of the true e^x (tests/cpu_kernels_test.cpp measures it);
// 0 below -87.3, where only denormals remain, and infinity above 88.72, past the largest float.
// A float's bits, and the float of bits, on either device (half.h builds its formats on them too).
COURSE_HOST_DEVICE inline std::uint32_t bits_of(float f) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(f);
#else
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}
COURSE_HOST_DEVICE inline float float_of(std::uint32_t u) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

COURSE_HOST_DEVICE inline float pow2_bits(std::int32_t n) {  // 2^n for n in [-126, 127]
  return float_of(static_cast<std::uint32_t>(n + 127) << 23);
}

constexpr float kExpMin = -87.3f, kExpMax = 88.72f;

COURSE_HOST_DEVICE inline float exp_f32(float x) {
  constexpr float kLog2e = 1.4426950408889634f;
  constexpr float kLn2Hi = 0.693145751953125f;        // ln 2 to 16 significant bits: n kLn2Hi is exact
  constexpr float kLn2Lo = 1.4286068203094172e-06f;   // ln 2 - kLn2Hi
  constexpr float kRound = 12582912.0f;                // 1.5 * 2^23: adding it rounds to an integer
  using namespace rn;
  const float xc = x < kExpMin ? kExpMin : (x > kExpMax ? kExpMax : x);
  const float n = sub(add(mul(xc, kLog2e), kRound), kRound);
  const float r = sub(sub(xc, mul(n, kLn2Hi)), mul(n, kLn2Lo));
  float p = 1.0f / 5040.0f;
  p = add(mul(p, r), 1.0f / 720.0f);
  p = add(mul(p, r), 1.0f / 120.0f);
  p = add(mul(p, r), 1.0f / 24.0f);
  p = add(mul(p, r), 1.0f / 6.0f);
  p = add(mul(p, r), 0.5f);
  p = add(mul(p, r), 1.0f);
  p = add(mul(p, r), 1.0f);
  const std::int32_t ni = static_cast<std::int32_t>(n), half = ni / 2;
  const float e = mul(mul(p, pow2_bits(half)), pow2_bits(ni - half));
  return x < kExpMin ? 0.0f : (x > kExpMax ? INFINITY : e);  // NaN falls through both: NaN
}

// erf(x) from arithmetic alone, as exp_f32, so that the exact GELU gives the same bits on both devices
// (CUDA's erff and glibc's are different approximations, an ulp or so apart). In double:
// - |x| < 2: the Maclaurin series, 2/sqrt(pi) x sum_n (-x^2)^n / (n! (2n + 1)), 28 terms (the next is
//   below 1e-15 at |x| = 2, and the largest term is about 1.2: no cancellation to speak of);
// - 2 <= |x| < 4: 1 - erfc(x), erfc(x) = e^{-x^2} / sqrt(pi) / (x + (1/2)/(x + 1/(x + (3/2)/(x + ...)))),
//   Laplace's continued fraction to depth 24 (within 1e-11 from 2 on), e^{-x^2} by exp_f32 (its 2 ulp
//   move erfc by under 1e-9, a sixtieth of float's ulp at 1);
// - |x| >= 4: +-1, the float nearest (erfc(4) = 1.5e-8 is under half an ulp below 1).
// Within one float ulp of the true erf (tests/cpu_kernels_test.cpp measures it); NaN gives NaN.
COURSE_HOST_DEVICE inline float erf_f32(float x) {
  using namespace rn;
  const double a = x < 0.0f ? -static_cast<double>(x) : static_cast<double>(x);
  double value;
  if (!(a < 4.0)) {
    value = a == a ? 1.0 : a;  // NaN stays NaN
  } else if (a < 2.0) {
    const double a2 = mul(a, a);
    double term = 1.0, sum = 1.0;
    for (int n = 1; n <= 28; ++n) {
      term = div(mul(term, -a2), static_cast<double>(n));
      sum = add(sum, div(term, static_cast<double>(2 * n + 1)));
    }
    value = mul(mul(1.1283791670955126, a), sum);  // 2/sqrt(pi) x sum
  } else {
    double f = a;
    for (int k = 24; k >= 1; --k) f = add(a, div(mul(0.5, static_cast<double>(k)), f));
    const auto af = static_cast<float>(a);
    const double e = exp_f32(-mul(af, af));
    value = sub(1.0, div(mul(e, 0.5641895835477563), f));  // 1/sqrt(pi)
  }
  const auto v = static_cast<float>(value);
  return x < 0.0f ? -v : v;
}

COURSE_HOST_DEVICE inline float gelu_erf(float x) {
  using namespace rn;
  return mul(mul(0.5f, x), add(1.0f, erf_f32(mul(x, kSqrtHalf))));
}

COURSE_HOST_DEVICE inline float gelu_erf_grad(float x) {  // Phi(x) + x phi(x)
  using namespace rn;
  const float phi = mul(0.5f, add(1.0f, erf_f32(mul(x, kSqrtHalf))));
  return add(phi, mul(mul(x, kInvSqrt2Pi), exp_f32(mul(mul(-0.5f, x), x))));
}

// The tanh form written through the logistic function, 0.5 (1 + tanh u) = 1 / (1 + exp(-2u)): the same
// function, but one exp instead of tanh (several times cheaper on the CPU), and accurate to the last bits
// where 1 + tanh u cancels (large negative x).
COURSE_HOST_DEVICE inline float gelu_tanh_sigmoid(float x) {
  using namespace rn;
  const float inner = mul(kGeluC, add(x, mul(mul(mul(kGeluA, x), x), x)));
  return div(1.0f, add(1.0f, exp_f32(mul(-2.0f, inner))));
}

COURSE_HOST_DEVICE inline float gelu_tanh(float x) { return rn::mul(x, gelu_tanh_sigmoid(x)); }

// d/dx [x s(2u)] = s + x 2 s (1 - s) u', with s(2u) = 0.5 (1 + tanh u) and 2 s (1 - s) = 0.5 (1 - tanh^2 u).
COURSE_HOST_DEVICE inline float gelu_tanh_grad(float x) {
  using namespace rn;
  const float s = gelu_tanh_sigmoid(x);
  const float d_inner = mul(kGeluC, add(1.0f, mul(mul(kGelu3A, x), x)));
  return add(s, mul(mul(mul(mul(2.0f, x), s), sub(1.0f, s)), d_inner));
}

COURSE_HOST_DEVICE inline float binary(BinaryOp op, float x, float y) {
  return op == BinaryOp::add   ? rn::add(x, y)
         : op == BinaryOp::sub ? rn::sub(x, y)
         : op == BinaryOp::mul ? rn::mul(x, y)
                               : (x < y ? y : x);  // max as std::max
}

COURSE_HOST_DEVICE inline float unary(UnaryOp op, float x) {
  return op == UnaryOp::relu ? (x > 0.0f ? x : 0.0f) : op == UnaryOp::gelu ? gelu_erf(x) : gelu_tanh(x);
}
// The gradient through the op: relu passes g or 0 (never g * 0, which would turn an infinite g into NaN).
COURSE_HOST_DEVICE inline float unary_backward(UnaryOp op, float x, float g) {
  return op == UnaryOp::relu ? (x > 0.0f ? g : 0.0f)
                             : rn::mul(g, op == UnaryOp::gelu ? gelu_erf_grad(x) : gelu_tanh_grad(x));
}

// Column sums (a linear layer's bias gradient, layer norm's weight and bias gradients) in two stages, one
// order on both devices. A thread per column walking every row leaves most of a GPU idle (GPT-2's 768
// columns against an H100's 270,000 resident threads) for the 8192 rows it reads, so the rows go in chunks
// of kColumnChunk: stage 1 sums each column over each chunk, rows in order, in double (on the GPU a
// thread per column and chunk); stage 2 adds each column's chunk sums, chunks in order, in double, from
// zero. The CPU adds in the same two stages, so both devices give the same bits; a sum of up to
// kColumnChunk rows is the plain loop's in row order.
constexpr std::size_t kColumnChunk = 256;
COURSE_HOST_DEVICE inline std::size_t column_chunks(std::size_t rows) { return (rows + kColumnChunk - 1) / kColumnChunk; }

// Stage 1: column c of `in` ([rows, cols]) over chunk `chunk`'s rows.
COURSE_HOST_DEVICE inline double column_chunk_sum(const float* in, std::size_t rows, std::size_t cols, std::size_t chunk,
                                                  std::size_t c) {
  const std::size_t end = rows < (chunk + 1) * kColumnChunk ? rows : (chunk + 1) * kColumnChunk;
  double sum = 0.0;
  for (std::size_t r = chunk * kColumnChunk; r < end; ++r) sum = rn::add(sum, static_cast<double>(in[r * cols + c]));
  return sum;
}

// One row's term of layer norm's weight gradient, g xhat, in double: xhat = (x - mean) rstd.
COURSE_HOST_DEVICE inline double layer_norm_weight_term(float x, float mean, float rstd, float g) {
  return rn::mul(static_cast<double>(g), rn::mul(static_cast<double>(rn::sub(x, mean)), static_cast<double>(rstd)));
}

// Stage 1 of layer norm's weight and bias gradients, column c over chunk `chunk`: the sums of g xhat and of g.
COURSE_HOST_DEVICE inline void layer_norm_params_chunk(const float* x, const float* mean, const float* rstd,
                                                       const float* g, std::size_t rows, std::size_t cols,
                                                       std::size_t chunk, std::size_t c, double* gw, double* gb) {
  const std::size_t end = rows < (chunk + 1) * kColumnChunk ? rows : (chunk + 1) * kColumnChunk;
  double w = 0.0, b = 0.0;
  for (std::size_t r = chunk * kColumnChunk; r < end; ++r) {
    w = rn::add(w, layer_norm_weight_term(x[r * cols + c], mean[r], rstd[r], g[r * cols + c]));
    b = rn::add(b, static_cast<double>(g[r * cols + c]));
  }
  *gw = w;
  *gb = b;
}

// Stage 2: column c's total from its chunk sums (`partial`, [chunks, cols]), in chunk order.
COURSE_HOST_DEVICE inline float column_total(const double* partial, std::size_t chunks, std::size_t cols, std::size_t c) {
  double total = 0.0;
  for (std::size_t k = 0; k < chunks; ++k) total = rn::add(total, partial[k * cols + c]);
  return static_cast<float>(total);
}

// nn.Dropout's factor for element `index` of a draw: 0 with probability p, else 1 / (1 - p).
COURSE_HOST_DEVICE inline float dropout_keep(std::uint64_t seed, std::uint64_t index, float p) {
  return random_uniform(seed, index) < static_cast<double>(p) ? 0.0f : rn::div(1.0f, rn::sub(1.0f, p));
}

// clip_grad_norm_'s factor from the gradients' global norm (a float32, as PyTorch's total_norm): max_norm /
// (norm + 1e-6) in double, rounded to float32, when the norm exceeds max_norm; 1 (no scaling) otherwise.
COURSE_HOST_DEVICE inline float clip_coefficient(float norm, double max_norm) {
  const auto n = static_cast<double>(norm);
  return max_norm > 0.0 && n > max_norm ? static_cast<float>(rn::div(max_norm, rn::add(n, 1e-6))) : 1.0f;
}

// An index stored as a float that an op may use: a whole number in [0, limit), or ignore_index (NaN: none).
COURSE_HOST_DEVICE inline bool valid_index(float id, std::size_t limit, float ignore_index) {
  return id == ignore_index ||
         (id >= 0.0f && id < static_cast<float>(limit) && id == static_cast<float>(static_cast<long long>(id)));
}

// torch.optim.SGD's update of one element: weight decay into the gradient, then momentum.
COURSE_HOST_DEVICE inline float sgd_update(float p, float g, float& buf, float lr, float momentum, float wd) {
  using namespace rn;
  g = add(g, mul(wd, p));
  buf = add(mul(momentum, buf), g);  // buf starts at zero, so the first step uses g itself, as in PyTorch
  return sub(p, mul(lr, buf));
}

// torch.optim.Adam's (and, decoupled, AdamW's) update of one element.
COURSE_HOST_DEVICE inline float adam_update(float p, float g, float& m, float& v, float lr, float b1, float b2,
                                            float eps, float wd, bool decoupled, float bc1, float bc2) {
  using namespace rn;
  if (decoupled) p = sub(p, mul(mul(lr, wd), p));
  else g = add(g, mul(wd, p));
  m = add(mul(b1, m), mul(sub(1.0f, b1), g));
  v = add(mul(b2, v), mul(mul(sub(1.0f, b2), g), g));
  const float m_hat = div(m, bc1);
  const float v_hat = div(v, bc2);
  return sub(p, div(mul(lr, m_hat), add(rn::sqrt(v_hat), eps)));
}

}  // namespace course::math
