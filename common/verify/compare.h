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
// rounding of zero flips, so the per-sample terms themselves differ. The lock-step reference therefore
// recomputes every part exactly as the run did (lockstep.h), and where a run reorders the computation
// itself (tensor and pipeline parallelism) it measures the step's own noise floor instead (below).
#pragma once
#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

#include "common/core/dtype.h"

namespace course::verify {

// How a format rounds: the relative error of one rounding to nearest (the unit roundoff u), the
// absolute error of one rounding in the subnormal range (half the smallest subnormal), which a
// relative bound does not cover, and the largest finite value (a sum reaching it may overflow).
struct Rounding {
  double unit_roundoff, subnormal, largest;
};
constexpr Rounding kFloat32Rounding{0x1p-24, 0x1p-150, 0x1.fffffep127};
// The 16-bit formats (mixed precision, chapter 05's compression hooks): fp16 has 11 significant bits,
// subnormals from 2^-24 and 65504 its largest value; bf16 has 8 significant bits and float32's range.
constexpr Rounding kFloat16Rounding{0x1p-11, 0x1p-25, 65504.0};
constexpr Rounding kBfloat16Rounding{0x1p-8, 0x1p-134, 0x1.fep127};
constexpr double kUnitRoundoff = kFloat32Rounding.unit_roundoff;
// The rounding of a tensor type (common/core/dtype.h).
constexpr Rounding rounding_of(DType dtype) {
  return dtype == DType::float16 ? kFloat16Rounding : dtype == DType::bfloat16 ? kBfloat16Rounding : kFloat32Rounding;
}

// gamma(n) = n u / (1 - n u); infinite when n u >= 1 (no bound).
double gamma(std::int64_t n, double unit_roundoff = kUnitRoundoff);

// The bound on |computed - exact| for a sum whose terms have absolute values adding up to
// `absolute_sum`, with at most `roundings` roundings in `rounding`'s format along the way.
double summation_bound(double absolute_sum, std::int64_t roundings, Rounding rounding = kFloat32Rounding);

// The largest |a[i] - b[i]|; throws std::invalid_argument when the sizes differ.
double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b);

// How far two free-running AdamW runs that differ by rounding alone may end apart after `steps` steps of
// learning rate `lr`, for runs too short for the chaotic growth to show (a few steps; the unit tests of
// ZeRO's stages against stage 0): AdamW moves a parameter by about lr per step at most, whatever the
// gradient's size, so rounding can only change a small fraction of that movement, a thousandth of
// lr x steps. A wrong shard, a missing unit or a double average changes whole updates, about lr each.
double short_run_tolerance(double lr, long steps);

// How far the final parameters of two free-running runs that cannot agree bit for bit end apart, beside
// a measured noise floor: the drift between two single-rank runs that differ only in summation order.
// A figure the chapters report (02, 04 --drift), never a verdict: the runs diverge chaotically, so over
// a long run the floor grows as large as a real fault's effect. The verdict is the lock-step check.
struct Drift {
  double difference = 0;  // trained run against the single-rank reference
  double noise_floor = 0; // single-rank reference against itself with the batch order reversed
  double ratio() const {
    if (noise_floor > 0) return difference / noise_floor;
    return difference == 0 ? 0.0 : std::numeric_limits<double>::infinity();
  }
};

// Where a step's computation is reordered rather than split into parts that a reference can repeat
// exactly (a row-parallel layer's inner sums split across the TP ranks, the parallel cross-entropy's
// per-rank sums, a pipeline's micro-batches and the two halves of its tied table), the error of the
// whole network's forward and backward cannot be bounded in closed form. The lock-step reference then
// measures the step's own rounding noise: from the same parameters over the same global batch, once as
// they are, and once with every parameter moved by one rounding (one unit in the last place, up or
// down) and the samples in reverse order. A different summation order perturbs every intermediate
// value of the network by a few roundings, not only the batch's sum, and a one-rounding nudge of every
// parameter does the same: the gradient's response to it is the floor (reversing the batch alone
// perturbs only the final sums, and tensor parallelism's gradients drifted 65 such floors from the
// reference in a correct run). Each tensor's gradient may then differ from the reference by
// kNoiseFloorFactor floors. The floor is measured anew at every step from the run's own parameters, so
// it does not grow with the run's length.
// Measured over 1000-step runs of every grid of chapter 08 (TP 2 and 3, PP 2 and 3, DP 3, SP, TP x PP,
// DP x TP x PP; the GPT at 1x and 10x its learning rate and four seeds, the MLP at TP 2 and 3): a correct
// step came at most 34 floors from the reference. Every fault, at the step it began: 1.3e5 floors (one
// micro-batch of 16 lost) to 2.9e6 (a skipped TP all-reduce), the rest between (a skipped DP average
// 8.5e5, a tied table not exchanged 1.6e6, a sequence-parallel sum left out 7.7e5). The factor sits
// near the geometric middle: 30 times the worst correct step, a hundredth of the mildest fault.
constexpr double kNoiseFloorFactor = 1000;
// Each tensor's tolerance from its measured floor, its largest gradient (the reference's) and its
// number of elements. The floor is the largest of the tensor's differences, a stable estimate for a
// large tensor (the maxima of many roundings' effects concentrate) but not for a small one: a one-element
// bias's floor is a single rounding difference, which can be any size down to zero, and its ratio to the
// run's difference has a Cauchy-like tail (a correct MLP's output bias reached 77 floors in 1000 steps).
// So no tensor's floor counts as less than the model's median floor relative to scale (floor / largest
// gradient, over the tensors) times its own largest gradient, and a tensor of fewer than
// kStableFloorElements elements takes the model's largest relative floor; nor is any floor less than one
// rounding of the tensor's largest gradient. The tolerance is kNoiseFloorFactor times that.
constexpr std::int64_t kStableFloorElements = 256;
std::vector<double> noise_floor_tolerances(const std::vector<double>& floors, const std::vector<double>& largest,
                                           const std::vector<std::int64_t>& elements);

// A gradient's norm computed, as the run's clipping computes it, from `partial_sums` sums of squares
// (one per rank that holds a part, each in double, sent in float32 and added in float32), against the
// same norm computed in double from the whole gradient: every partial sum is rounded once and the
// partial_sums - 1 additions of positive terms round once each, so the sum of squares is within
// gamma(2 partial_sums) of the exact one, relatively, and its square root within half that, plus the
// rounding of the root.
double norm_bound(double norm, std::int64_t partial_sums);

}  // namespace course::verify
