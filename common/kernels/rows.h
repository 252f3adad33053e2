// Row reductions shared by the CPU and CUDA kernels: sums and maxima in lanes, and the row formulas of
// layer normalisation and the cross-entropy written once over them, so both devices give the same bits.
//
// A row's sum runs in kLanes lanes: lane l adds terms l, l + kLanes, l + 2 kLanes, ... in float, and the
// lanes' partial sums are then added in lane order, in double. The CPU runs the lanes side by side in one
// thread (the loop vectorises without reordering a float addition); the GPU gives each lane a thread of
// its own, kLanes threads to a row (a warp holds four rows), and folds the lanes with shuffles. The
// additions are the same, one by one, so the bits are, and the GPU reads a row with eight threads
// instead of walking it with one (GPT-2's 50,304-wide logits, 8192 rows to a batch).
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

#include "common/kernels/math.h"
#include "common/kernels/rounded.h"

namespace course::math {

constexpr std::size_t kLanes = 8;

// Lane l's partial sum: term(l) + term(l + kLanes) + ..., in float from zero.
template <class Term>
COURSE_HOST_DEVICE inline float lane_partial(std::size_t n, std::size_t l, Term term) {
  float acc = 0.0f;
  for (std::size_t i = l; i < n; i += kLanes) acc = rn::add(acc, term(i));
  return acc;
}

// The partials added in lane order, in double.
COURSE_HOST_DEVICE inline double lane_fold(const float* acc) {
  double total = 0.0;
  for (std::size_t l = 0; l < kLanes; ++l) total = rn::add(total, static_cast<double>(acc[l]));
  return total;
}

// The sum of term(i) for i in [0, n), every lane in one thread: the partials of lane_partial, side by side.
template <class Term>
COURSE_HOST_DEVICE inline double lane_sum(std::size_t n, Term term) {
  float acc[kLanes] = {};
  std::size_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (std::size_t l = 0; l < kLanes; ++l) acc[l] = rn::add(acc[l], term(i + l));
  for (std::size_t l = 0; i + l < n; ++l) acc[l] = rn::add(acc[l], term(i + l));
  return lane_fold(acc);
}

// The maximum by the same lanes, for n >= 1: every lane starts at x[0] (std::max's rule: a NaN may be
// skipped, as in std::max_element), and the lanes are folded in order. `Row` is a float pointer or
// anything else that x[i] reads a float from (a row of 16-bit values: HalfRow).
template <class Row>
COURSE_HOST_DEVICE inline float lane_max_partial(const Row& x, std::size_t n, std::size_t l) {
  float acc = x[0];
  for (std::size_t i = l; i < n; i += kLanes) acc = acc < x[i] ? x[i] : acc;
  return acc;
}
COURSE_HOST_DEVICE inline float lane_max_fold(const float* acc) {
  float top = acc[0];
  for (std::size_t l = 1; l < kLanes; ++l) top = top < acc[l] ? acc[l] : top;
  return top;
}
template <class Row>
COURSE_HOST_DEVICE inline float lane_max(const Row& x, std::size_t n) {
  float acc[kLanes];
  for (std::size_t l = 0; l < kLanes; ++l) acc[l] = x[0];
  std::size_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (std::size_t l = 0; l < kLanes; ++l) acc[l] = acc[l] < x[i + l] ? x[i + l] : acc[l];
  for (std::size_t l = 0; i + l < n; ++l) acc[l] = acc[l] < x[i + l] ? x[i + l] : acc[l];
  return lane_max_fold(acc);
}

// Who runs a row's lanes. The row formulas below take one of these: AllLanes runs them all in the
// calling thread (the CPU, or a lone GPU thread); the CUDA kernels pass their own, a group of kLanes
// threads, each of which runs its lane and visits the row's elements first(), first() + stride(), ...
struct AllLanes {
  template <class Term>
  COURSE_HOST_DEVICE double sum(std::size_t n, Term term) const { return lane_sum(n, term); }
  template <class Row>
  COURSE_HOST_DEVICE float max(const Row& x, std::size_t n) const { return lane_max(x, n); }
  COURSE_HOST_DEVICE static constexpr std::size_t first() { return 0; }
  COURSE_HOST_DEVICE static constexpr std::size_t stride() { return 1; }
};

// The natural logarithm in double from arithmetic alone, so that both devices take the same bits (CUDA's
// log and glibc's are each within an ulp or so, not always the same one). The textbook method (as
// fdlibm's): x = 2^e m with m in [sqrt(1/2), sqrt(2)), log m = 2 atanh(s) = 2 (s + s^3/3 + s^5/5 + ...)
// with s = (m - 1)/(m + 1), |s| <= 0.1716, to s^25 (the next term is below 1e-20 of the sum), and e ln 2 in
// two parts so that e times the first is exact. Within 3 ulp of the true log (tests/row_lanes_test.cpp
// measures it); log 0 = -inf, log inf = inf, NaN and negatives give NaN.
COURSE_HOST_DEVICE inline double log_f64(double x) {
  using namespace rn;
  if (!(x > 0.0)) return x == 0.0 ? -INFINITY : NAN;
  if (x == INFINITY) return x;
  int e = 0;
  if (x < 2.2250738585072014e-308) x = mul(x, 18014398509481984.0), e = -54;  // a subnormal, times 2^54
  std::uint64_t bits;
#ifdef __CUDA_ARCH__
  bits = static_cast<std::uint64_t>(__double_as_longlong(x));
#else
  std::memcpy(&bits, &x, sizeof bits);
#endif
  e += static_cast<int>((bits >> 52) & 0x7FF) - 1023;
  const std::uint64_t mantissa = (bits & 0xFFFFFFFFFFFFFull) | 0x3FF0000000000000ull;  // m in [1, 2)
  double m;
#ifdef __CUDA_ARCH__
  m = __longlong_as_double(static_cast<long long>(mantissa));
#else
  std::memcpy(&m, &mantissa, sizeof m);
#endif
  if (m > 1.4142135623730951) m = mul(m, 0.5), e += 1;  // exact
  const double s = div(sub(m, 1.0), add(m, 1.0));      // m - 1 is exact (Sterbenz)
  const double s2 = mul(s, s);
  constexpr double kOdd[] = {1.0,        1.0 / 3,  1.0 / 5,  1.0 / 7,  1.0 / 9,  1.0 / 11, 1.0 / 13,
                             1.0 / 15,   1.0 / 17, 1.0 / 19, 1.0 / 21, 1.0 / 23, 1.0 / 25};
  double p = kOdd[12];
  for (int k = 11; k >= 0; --k) p = add(mul(p, s2), kOdd[k]);
  constexpr double kLn2Hi = 6.93147180369123816490e-01;  // ln 2's first 32 bits: e kLn2Hi is exact
  constexpr double kLn2Lo = 1.90821492927058770002e-10;  // ln 2 - kLn2Hi
  const auto ed = static_cast<double>(e);
  return add(mul(ed, kLn2Hi), add(mul(ed, kLn2Lo), mul(mul(2.0, s), p)));
}

// One row of layer normalisation: the mean, then the biased variance around it (two passes, as accurate
// as Welford's for a row), then (x - mean) / sqrt(var + eps) * w + b.
template <class Lanes>
COURSE_HOST_DEVICE inline void layer_norm_row(const Lanes& lanes, const float* x, const float* w, const float* b,
                                              std::size_t cols, float eps, float* out, float* mean, float* rstd) {
  using namespace rn;
  const double n = static_cast<double>(cols);
  const auto mu = static_cast<float>(div(lanes.sum(cols, [&](std::size_t c) { return x[c]; }), n));
  const double var = div(lanes.sum(cols, [&](std::size_t c) { return mul(sub(x[c], mu), sub(x[c], mu)); }), n);
  const auto inv = static_cast<float>(div(1.0, rn::sqrt(add(var, static_cast<double>(eps)))));
  if (lanes.first() == 0) *mean = mu, *rstd = inv;
  for (std::size_t c = lanes.first(); c < cols; c += lanes.stride()) out[c] = add(mul(mul(sub(x[c], mu), inv), w[c]), b[c]);
}

// Its input gradient: dx = rstd (dxhat - mean(dxhat) - xhat mean(dxhat xhat)), with dxhat = g w.
template <class Lanes>
COURSE_HOST_DEVICE inline void layer_norm_backward_row(const Lanes& lanes, const float* x, const float* w, float mean,
                                                       float rstd, const float* g, std::size_t cols, float* dx) {
  using namespace rn;
  const double n = static_cast<double>(cols);
  const auto mean_d = static_cast<float>(div(lanes.sum(cols, [&](std::size_t c) { return mul(g[c], w[c]); }), n));
  const auto mean_dx = static_cast<float>(
      div(lanes.sum(cols, [&](std::size_t c) { return mul(mul(g[c], w[c]), mul(sub(x[c], mean), rstd)); }), n));
  for (std::size_t c = lanes.first(); c < cols; c += lanes.stride())
    dx[c] = mul(rstd, sub(sub(mul(g[c], w[c]), mean_d), mul(mul(sub(x[c], mean), rstd), mean_dx)));
}

// One row's softmax denominator: the largest logit, and the sum of exp(logit - largest) (so exp cannot
// overflow); exp is exp_f32.
struct RowExpSum {
  float top;
  double total;
};
template <class Lanes, class Row>
COURSE_HOST_DEVICE inline RowExpSum row_exp_sum(const Lanes& lanes, const Row& row, std::size_t cols) {
  const float top = lanes.max(row, cols);
  return {top, lanes.sum(cols, [&](std::size_t c) { return exp_f32(rn::sub(row[c], top)); })};
}

// One row's cross-entropy against class `target`: log-sum-exp minus the target's logit. `e`: the row's
// row_exp_sum, which backward can keep instead of computing it again.
template <class Row>
COURSE_HOST_DEVICE inline float cross_entropy_of(const RowExpSum& e, const Row& row, std::size_t target) {
  using namespace rn;
  return static_cast<float>(sub(add(log_f64(e.total), static_cast<double>(e.top)), static_cast<double>(row[target])));
}
template <class Lanes, class Row>
COURSE_HOST_DEVICE inline float cross_entropy_row(const Lanes& lanes, const Row& row, std::size_t cols,
                                                  std::size_t target) {
  return cross_entropy_of(row_exp_sum(lanes, row, cols), row, target);
}

// Its gradient: (softmax - one_hot(target)) times the row's incoming gradient g, from the row's
// row_exp_sum `e`. `Out` is a float pointer, or anything out[c] = value stores through (HalfRow: rounded
// once to 16 bits).
template <class Lanes, class Row, class Out>
COURSE_HOST_DEVICE inline void cross_entropy_backward_of(const Lanes& lanes, const RowExpSum& e, const Row& row,
                                                         std::size_t cols, std::size_t target, float g, Out out) {
  using namespace rn;
  const auto scale = static_cast<float>(div(static_cast<double>(g), e.total));
  for (std::size_t c = lanes.first(); c < cols; c += lanes.stride()) {
    const float p = mul(exp_f32(sub(row[c], e.top)), scale);
    out[c] = c == target ? sub(p, g) : p;
  }
}
template <class Lanes, class Row, class Out>
COURSE_HOST_DEVICE inline void cross_entropy_backward_row(const Lanes& lanes, const Row& row, std::size_t cols,
                                                          std::size_t target, float g, Out out) {
  cross_entropy_backward_of(lanes, row_exp_sum(lanes, row, cols), row, cols, target, g, out);
}

// One row of attention's probabilities, in place over its scores: softmax over the first `visible` (the
// keys the mask lets the query see), 0 from there up to `width`. exp is exp_f32, stored as it is summed,
// then scaled by the sum's reciprocal.
template <class Lanes>
COURSE_HOST_DEVICE inline void attention_softmax_row(const Lanes& lanes, float* row, std::size_t visible,
                                                     std::size_t width) {
  const float top = lanes.max(row, visible);
  const double total = lanes.sum(visible, [&](std::size_t c) {
    const float e = exp_f32(rn::sub(row[c], top));
    row[c] = e;
    return e;
  });
  const auto inverse = static_cast<float>(rn::div(1.0, total));
  for (std::size_t c = lanes.first(); c < width; c += lanes.stride()) row[c] = c < visible ? rn::mul(row[c], inverse) : 0.0f;
}

// Its gradient, in place over dp (the gradient of the probabilities p): ds = p (dp - sum_j dp_j p_j) scale
// on the visible keys, 0 after them up to `width`.
template <class Lanes>
COURSE_HOST_DEVICE inline void attention_softmax_backward_row(const Lanes& lanes, const float* p, float* dp,
                                                              std::size_t visible, std::size_t width, float scale) {
  using namespace rn;
  const auto dot = static_cast<float>(lanes.sum(visible, [&](std::size_t c) { return mul(dp[c], p[c]); }));
  for (std::size_t c = lanes.first(); c < width; c += lanes.stride())
    dp[c] = c < visible ? mul(mul(p[c], sub(dp[c], dot)), scale) : 0.0f;
}

}  // namespace course::math
