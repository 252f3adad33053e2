// Scalar formulas shared by the CPU and CUDA kernels, so both compute the same expression.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

#include "common/kernels/kernels.h"

#ifdef __CUDACC__
#define COURSE_HOST_DEVICE __host__ __device__
#else
#define COURSE_HOST_DEVICE
#endif

namespace course::math {

// GELU (Hendrycks & Gimpel, "Gaussian Error Linear Units", 2016): exactly x * Phi(x), Phi the standard
// normal's distribution function, and the paper's tanh approximation, which GPT-2 was trained with.
constexpr float kSqrtHalf = 0.7071067811865476f;     // 1/sqrt(2)
constexpr float kInvSqrt2Pi = 0.3989422804014327f;   // 1/sqrt(2 pi)

COURSE_HOST_DEVICE inline float gelu_erf(float x) { return 0.5f * x * (1.0f + erff(x * kSqrtHalf)); }

COURSE_HOST_DEVICE inline float gelu_erf_grad(float x) {
  return 0.5f * (1.0f + erff(x * kSqrtHalf)) + x * kInvSqrt2Pi * expf(-0.5f * x * x);  // Phi(x) + x phi(x)
}

constexpr float kGeluC = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kGeluA = 0.044715f;

// e^x in float from arithmetic alone, so a loop of it vectorises (a call to expf does not), and both
// devices run the same instructions. The textbook method: x = n ln2 + r with n an integer and
// |r| <= ln2 / 2 (Cody and Waite's two-part ln2, so n ln2 is exact), e^r by its Taylor series to r^7
// (the next term is below 6e-9, under half a float ulp), and 2^n put straight into exponent bits, in two
// halves so that n up to 128 fits. Within 2 ulp of the true e^x (tests/math_test.cpp measures it);
// 0 below -87.3, where only denormals remain, and infinity above 88.72, past the largest float.
COURSE_HOST_DEVICE inline float pow2_bits(std::int32_t n) {  // 2^n for n in [-126, 127]
  const std::int32_t bits = (n + 127) << 23;
#ifdef __CUDA_ARCH__
  return __int_as_float(bits);
#else
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
#endif
}

constexpr float kExpMin = -87.3f, kExpMax = 88.72f;

COURSE_HOST_DEVICE inline float exp_f32(float x) {
  constexpr float kLog2e = 1.4426950408889634f;
  constexpr float kLn2Hi = 0.693145751953125f;        // ln 2 to 16 significant bits: n kLn2Hi is exact
  constexpr float kLn2Lo = 1.4286068203094172e-06f;   // ln 2 - kLn2Hi
  constexpr float kRound = 12582912.0f;                // 1.5 * 2^23: adding it rounds to an integer
  const float xc = x < kExpMin ? kExpMin : (x > kExpMax ? kExpMax : x);
  const float n = (xc * kLog2e + kRound) - kRound;
  const float r = (xc - n * kLn2Hi) - n * kLn2Lo;
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const std::int32_t ni = static_cast<std::int32_t>(n), half = ni / 2;
  const float e = p * pow2_bits(half) * pow2_bits(ni - half);
  return x < kExpMin ? 0.0f : (x > kExpMax ? INFINITY : e);  // NaN falls through both: NaN
}

// The tanh form written through the logistic function, 0.5 (1 + tanh u) = 1 / (1 + exp(-2u)): the same
// function, but one exp instead of tanh (several times cheaper on the CPU), and accurate to the last bits
// where 1 + tanh u cancels (large negative x).
COURSE_HOST_DEVICE inline float gelu_tanh_sigmoid(float x) {
  const float inner = kGeluC * (x + kGeluA * x * x * x);
  return 1.0f / (1.0f + exp_f32(-2.0f * inner));
}

COURSE_HOST_DEVICE inline float gelu_tanh(float x) { return x * gelu_tanh_sigmoid(x); }

// d/dx [x s(2u)] = s + x 2 s (1 - s) u', with s(2u) = 0.5 (1 + tanh u) and 2 s (1 - s) = 0.5 (1 - tanh^2 u).
COURSE_HOST_DEVICE inline float gelu_tanh_grad(float x) {
  const float s = gelu_tanh_sigmoid(x);
  const float d_inner = kGeluC * (1.0f + 3.0f * kGeluA * x * x);
  return s + 2.0f * x * s * (1.0f - s) * d_inner;
}

COURSE_HOST_DEVICE inline float binary(BinaryOp op, float x, float y) {
  return op == BinaryOp::add ? x + y : op == BinaryOp::sub ? x - y : op == BinaryOp::mul ? x * y : (x < y ? y : x);  // max as std::max
}

COURSE_HOST_DEVICE inline float unary(UnaryOp op, float x) {
  return op == UnaryOp::relu ? (x > 0.0f ? x : 0.0f) : op == UnaryOp::gelu ? gelu_erf(x) : gelu_tanh(x);
}
// The gradient through the op: relu passes g or 0 (never g * 0, which would turn an infinite g into NaN).
COURSE_HOST_DEVICE inline float unary_backward(UnaryOp op, float x, float g) {
  return op == UnaryOp::relu ? (x > 0.0f ? g : 0.0f)
                             : g * (op == UnaryOp::gelu ? gelu_erf_grad(x) : gelu_tanh_grad(x));
}

// A sum that vectorises without reordering float additions: kLanes accumulators each take every
// kLanes-th term, and the lanes are added at the end, in a fixed order, in double. The same bits on any
// machine and at any thread count (the order is the code's), and on the GPU (one thread runs the loop).
constexpr std::size_t kLanes = 8;
template <class Term>
COURSE_HOST_DEVICE inline double lane_sum(std::size_t n, Term term) {
  float acc[kLanes] = {};
  std::size_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (std::size_t l = 0; l < kLanes; ++l) acc[l] += term(i + l);
  for (std::size_t l = 0; i + l < n; ++l) acc[l] += term(i + l);
  double total = 0.0;
  for (std::size_t l = 0; l < kLanes; ++l) total += static_cast<double>(acc[l]);
  return total;
}

// One row of layer normalisation, for the CPU reference and the CUDA kernel alike: the mean, then the
// biased variance around it (two passes, as accurate as Welford's for a row), then
// (x - mean) / sqrt(var + eps) * w + b, every pass a vectorisable loop in float.
COURSE_HOST_DEVICE inline void layer_norm_row(const float* x, const float* w, const float* b, std::size_t cols,
                                              float eps, float* out, float* mean, float* rstd) {
  const double n = static_cast<double>(cols);
  const auto mu = static_cast<float>(lane_sum(cols, [&](std::size_t c) { return x[c]; }) / n);
  const double var = lane_sum(cols, [&](std::size_t c) { return (x[c] - mu) * (x[c] - mu); }) / n;
  const auto inv = static_cast<float>(1.0 / sqrt(var + static_cast<double>(eps)));
  *mean = mu;
  *rstd = inv;
  for (std::size_t c = 0; c < cols; ++c) out[c] = (x[c] - mu) * inv * w[c] + b[c];
}

// Its input gradient: dx = rstd (dxhat - mean(dxhat) - xhat mean(dxhat xhat)), with dxhat = g w.
COURSE_HOST_DEVICE inline void layer_norm_backward_row(const float* x, const float* w, float mean, float rstd,
                                                       const float* g, std::size_t cols, float* dx) {
  const double n = static_cast<double>(cols);
  const auto mean_d = static_cast<float>(lane_sum(cols, [&](std::size_t c) { return g[c] * w[c]; }) / n);
  const auto mean_dx =
      static_cast<float>(lane_sum(cols, [&](std::size_t c) { return g[c] * w[c] * ((x[c] - mean) * rstd); }) / n);
  for (std::size_t c = 0; c < cols; ++c) dx[c] = rstd * (g[c] * w[c] - mean_d - (x[c] - mean) * rstd * mean_dx);
}

// The weight's and bias's gradients for column c: sums over the rows, in order, in double. (The CPU runs
// the same sums a block of columns at a time, reading rows in order: the same bits, contiguous reads.)
COURSE_HOST_DEVICE inline void layer_norm_params_column(const float* x, const float* mean, const float* rstd,
                                                        const float* g, std::size_t rows, std::size_t cols,
                                                        std::size_t c, float* dw, float* db) {
  double gw = 0.0, gb = 0.0;
  for (std::size_t r = 0; r < rows; ++r) {
    gw += static_cast<double>(g[r * cols + c]) * ((x[r * cols + c] - mean[r]) * static_cast<double>(rstd[r]));
    gb += g[r * cols + c];
  }
  dw[c] = static_cast<float>(gw);
  db[c] = static_cast<float>(gb);
}

COURSE_HOST_DEVICE inline float sgd_update(float p, float g, float& buf, float lr, float momentum, float wd) {
  g += wd * p;
  buf = momentum * buf + g;  // buf starts at zero, so the first step uses g itself, as in PyTorch
  return p - lr * buf;
}

COURSE_HOST_DEVICE inline float adam_update(float p, float g, float& m, float& v, float lr, float b1, float b2,
                                            float eps, float wd, bool decoupled, float bc1, float bc2) {
  if (decoupled) p -= lr * wd * p;
  else g += wd * p;
  m = b1 * m + (1.0f - b1) * g;
  v = b2 * v + (1.0f - b2) * g * g;
  float m_hat = m / bc1;
  float v_hat = v / bc2;
  return p - lr * m_hat / (sqrtf(v_hat) + eps);
}

}  // namespace course::math
