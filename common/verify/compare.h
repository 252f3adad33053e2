// Comparing two evaluations of the same computation in float32, with tolerances derived from the
// rounding of the sums involved rather than picked by hand.
//
// The derivation (Higham, "Accuracy and Stability of Numerical Algorithms", 2nd ed., section 4.2):
// adding n float32 numbers x_i in any order gives a result within gamma(n-1) * sum |x_i| of the
// exact sum, where gamma(n) = n u / (1 - n u) and u = 2^-24 is the unit roundoff; each further
// rounding (a scaling by 1/R) adds u of the result. A step's gradient in data parallelism is
// c * (g_1 + ... + g_R): R partial gradients (the ranks' shares, or micro-batches) added by an
// all-reduce or by += accumulation, then scaled. If a reference computes every g_r exactly as the
// run did and adds them exactly (in double), the two differ by at most
//     gamma(R + 1) * sum_r |c g_r|        elementwise.
// What cannot be bounded this way is one batch against the same samples in several pieces: a GEMM
// rounds each row differently for different row counts, and a ReLU whose input is within that
// rounding of zero flips, so the per-sample terms themselves differ. That comparison (chapter 02's
// lesson, and the final parameters of every chapter) is made against a measured noise floor instead.
#pragma once
#include <cstdint>
#include <limits>
#include <vector>

namespace course::verify {

constexpr double kUnitRoundoff = 0x1p-24;  // float32, round to nearest
// The smallest positive float32 (subnormal): each rounding in the subnormal range may be off by
// this much absolutely, which a relative bound does not cover.
constexpr double kSmallestSubnormal = 0x1p-149;

// gamma(n) = n u / (1 - n u); infinite when n u >= 1 (no bound).
double gamma(std::int64_t n);

// The bound on |computed - exact| for a float32 sum whose terms have absolute values adding up to
// `absolute_sum`, with at most `roundings` roundings along the way (plus the subnormal range).
double summation_bound(double absolute_sum, std::int64_t roundings);

// The largest |a[i] - b[i]|; throws std::invalid_argument when the sizes differ.
double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b);

// Final parameters of two runs that cannot agree bit for bit diverge chaotically with the number of
// steps, so they are compared with a measured noise floor: the drift between two single-rank runs
// that differ only in summation order. The ratio is reported, not judged.
struct Drift {
  double difference = 0;  // trained run against the single-rank reference
  double noise_floor = 0; // single-rank reference against itself with the batch order reversed
  double ratio() const {
    if (noise_floor > 0) return difference / noise_floor;
    return difference == 0 ? 0.0 : std::numeric_limits<double>::infinity();
  }
};

}  // namespace course::verify
