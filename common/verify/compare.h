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
// A 16-bit compression hook scales each part, rounds it to 16 bits and adds in 16 bits: R + 1
// roundings with the 16-bit unit roundoff (2^-11 for fp16, 2^-8 for bf16), plus half the smallest
// 16-bit subnormal for each, since small gradients fall into fp16's subnormal range.
// What cannot be bounded this way is one batch against the same samples in several pieces: a GEMM
// rounds each row differently for different row counts, and a ReLU whose input is within that
// rounding of zero flips, so the per-sample terms themselves differ. That comparison (chapter 02's
// lesson, and the final parameters of every chapter) is made against a measured noise floor instead.
#pragma once
#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

namespace course::verify {

// How a format rounds: the relative error of one rounding to nearest (the unit roundoff u), and the
// absolute error of one rounding in the subnormal range (half the smallest subnormal), which a
// relative bound does not cover.
struct Rounding {
  double unit_roundoff, subnormal;
};
constexpr Rounding kFloat32Rounding{0x1p-24, 0x1p-150};
// The 16-bit formats of chapter 05's compression hooks: fp16 has 11 significant bits and subnormals
// from 2^-24; bf16 has 8 significant bits and float32's exponent range.
constexpr Rounding kFloat16Rounding{0x1p-11, 0x1p-25};
constexpr Rounding kBfloat16Rounding{0x1p-8, 0x1p-134};
constexpr double kUnitRoundoff = kFloat32Rounding.unit_roundoff;

// gamma(n) = n u / (1 - n u); infinite when n u >= 1 (no bound).
double gamma(std::int64_t n, double unit_roundoff = kUnitRoundoff);

// The bound on |computed - exact| for a sum whose terms have absolute values adding up to
// `absolute_sum`, with at most `roundings` roundings in `rounding`'s format along the way.
double summation_bound(double absolute_sum, std::int64_t roundings, Rounding rounding = kFloat32Rounding);

// The largest |a[i] - b[i]|; throws std::invalid_argument when the sizes differ.
double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b);

// Final parameters of two runs that cannot agree bit for bit diverge chaotically with the number of
// steps, so they are compared with a measured noise floor: the drift between two single-rank runs
// that differ only in summation order.
struct Drift {
  double difference = 0;  // trained run against the single-rank reference
  double noise_floor = 0; // single-rank reference against itself with the batch order reversed
  double ratio() const {
    if (noise_floor > 0) return difference / noise_floor;
    return difference == 0 ? 0.0 : std::numeric_limits<double>::infinity();
  }
  // The verdict of chapters 06-08: within kDriftFactor noise floors, or within `short_run_tolerance`
  // for runs too short for any noise to show (0: none).
  bool within(double short_run_tolerance = 0) const;
};

// The first steps of a run, before rounding noise has grown. The Drift of a whole run is judged
// against the reference's noise floor at the end, and over a long run that floor grows as large as a
// real fault's effect (a skipped DP average, 1000 steps: 0.48 against a floor of 0.40). A fault shows
// from the first step, while rounding noise starts at a few ulps: so a step is *early* while
// kDriftFactor times the floor reached by then (the reordered run against the reference, up to that
// step) is within the step's tolerance, max((step + 1) x tolerance_per_step, kDriftFactor ulps of the
// reference's loss), and an early step's loss must match the reference's within that tolerance.
// run[i] is step first + i; reference and reordered start at step 0.
struct EarlySteps {
  std::size_t checked = 0;      // early steps compared
  std::size_t worst_step = 0;   // the one nearest its tolerance
  double difference = 0, tolerance = 0;
  bool passed() const { return difference <= tolerance; }
};
EarlySteps check_early_steps(const std::vector<float>& run, const std::vector<float>& reference,
                             const std::vector<float>& reordered, double tolerance_per_step, std::size_t first = 0);

// How far a distributed run may drift from its single-rank reference, in noise floors. Splitting a
// batch, a layer or the optimizer's state reorders sums and nothing more, and rounding differences
// grow alike whatever their source; a wrong shard, a lost gradient, a replayed batch or a double
// average lands orders of magnitude further out.
constexpr double kDriftFactor = 100;

}  // namespace course::verify
