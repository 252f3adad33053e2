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
// it does not grow with the run's length (each tensor's is the largest of its last few, FloorHistory).
// Measured on 2026-11-27 (scripts/noise_floor_margins.sh): 1000-step runs of every grid of chapter 08 in
// float32 (TP 2, 3 and 4, with and without SP; CP 2, ring and Ulysses; PP 2 and 3, and interleaved; DP 3;
// TP x PP, TP x CP, DP x TP with SP; the GPT at its learning rate and at ten times it, with another seed;
// the MLP at TP 2 and 3 and DP 2 x TP 2): a correct step's gradient came at most 9.6 floors from the
// reference (the MLP at TP 3); 24 of the 32 runs stayed within 5. A bug in the layer code, the GPT's
// tensor-parallel MLPs computing the exact GELU where the model has the tanh form (chapter 08's --fault
// exact-gelu, the default GPT at TP 2), came 184 to 613 floors away in its first ten steps; a lost
// micro-batch 1.3e5 floors, a skipped TP all-reduce 2.9e6. The factor is 5 times the worst correct
// step, and under a third of the GELU's smallest step.
constexpr double kNoiseFloorFactor = 50;
// The loss is one number, and its floor the least stable: near convergence the loss hardly moves with
// the parameters (its gradient is small), so nudging them barely moves it, while the split
// cross-entropy's own roundings do not shrink with it. The same runs' loss came at most 81 floors from the
// reference (DP 2 x TP 2 with SP), its other runs within 45. Its factor is 12 times that; a fault that
// changes the loss changes the gradient too, which is held to kNoiseFloorFactor.
constexpr double kLossNoiseFloorFactor = 1000;
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
// A Euclidean floor (the whole model's check, below) is no one draw: it is the norm of every element's
// rounding effect, and over n elements its relative spread falls as 1 / sqrt(2 n): a third at 4 elements,
// an eighth at 32. So there a tensor from kStableEuclideanFloorElements elements up keeps its own floor
// (raised to the median, as a large one is), and only a smaller one takes the largest relative floor:
// a layer norm's gradient, a sum that nearly cancels, comes out 5% from float32 in bf16 where a bias's is
// 0.5%, and the bias held to the layer norm's share let its gradient halved pass (--fault
// sp-average-biases in chapter 08).
constexpr std::int64_t kStableEuclideanFloorElements = 16;
// A floor is one draw of a rounding difference, and one draw can come out near zero, the more likely the
// fewer elements it is the largest of (a one-element bias, the loss): the run's difference over such a
// floor has a heavy tail (a correct TP 2 run with sequence parallelism reached 44 floors on a layer
// norm's bias, and its loss 290, in 1000 steps). The floor moves slowly with training, so each tensor's
// floor, and the loss's, is the largest of its last kFloorHistory measurements: with that, the same run's
// worst step came 7.8 floors from the reference and its loss 30.
constexpr int kFloorHistory = 16;
class FloorHistory {
 public:
  // Records this step's floor of item `index` (a tensor, or the loss) and returns the largest of its last
  // kFloorHistory, this one included.
  double remember(std::size_t index, double floor);

 private:
  std::vector<std::vector<double>> floors_;  // per item, its last floors, oldest first
};
// A 16-bit run whose parts its own split layers repeat (lockstep.h, check_parts with
// ModelParallelReference) is also held to the whole model, which shares none of that code
// (Lockstep::check_whole): its gradient against the whole model's in float32 on the whole global batch,
// beside the 16-bit floor, the whole model's own distance from float32 when it computes in the run's
// precision. The distances are taken per tensor as Euclidean norms: 16-bit rounding moves every element
// by a few units of its last place (bf16's is 0.4%), and the norm of those moves over a tensor is a
// steadier measure of their size than the largest one; a bug in a split layer (rows gathered in the
// wrong order, a key-value block left out, a partial product never summed) moves the whole tensor by far
// more. Each floor is the largest of the tensor's last kFloorHistory, and noise_floor_tolerances pools
// them as for float32 (below).
// Measured on 2026-11-27 (scripts/noise_floor_margins.sh --sixteen-bit): 1000-step runs of every grid of
// chapter 08 whose parts come from the split layers (TP 2, 3 and 4, with and without SP; CP 2, ring and
// Ulysses; TP x CP, DP x TP with SP, TP x PP; the MLP at TP 2 and 3, DP 2 x TP 2 and DP 3), each in bf16
// with its sums in bf16 and in fp16 at ten times the learning rate: a correct step came at most 9.3
// floors from the float32 gradient (TP 3 in fp16), 21 of the 26 runs within 5; its loss at most 16 (the
// same run), the others within 9. The three bugs of chapter 08's --fault (sp-gather-rows, ring-drop-block,
// row-parallel-no-sum, the default GPT in bf16) came 163 to 343 floors away at their first step. The
// factors are 2.7 and 3 times the worst correct step; the bugs come 6.5 times the gradient's or more.
// Measured again on 2026-11-29, the 16-bit floor now computed in the emulation (EmulatedSixteenBits), the
// same 24 runs of the split grids: at most 9.31 floors (TP 2 with SP in bf16) and a loss 16.25 (TP 3 in
// fp16), every run passing, and every 16-bit part the emulation's bits (Lockstep::check_emulated).
// Measured again on 2026-11-30, each floor now remembered as a share of its step's gradient (the gradient
// falls tenfold in the first steps, and a floor remembered as measured let a late step's tensor be half
// wrong) and a tensor of 16 elements or more on its own floor (kStableEuclideanFloorElements), the same
// grids, 30 runs: at most 17.5 floors (the MLP's one-element output bias at step 20 of DP 3 in fp16, where
// every tensor's floor was under 0.1% of its gradient), every other run within 13.2, and a loss 16.25 (TP 3
// in fp16). The factor is 2.9 times the worst; the split layers' own bugs are held far tighter in float32
// (kSplitFloat32FloorShare, below).
constexpr double kWholeModelFloorFactor = 50;
constexpr double kWholeModelLossFloorFactor = 50;
// The 16-bit floor is wide where a step is ill-conditioned: there a correct bf16 run's gradient came
// 30-50% of a tensor from float32's (TP 2 with SP, steps 196 and 457 of 1000), and a split-layer bug that
// halves a small tensor on every TP rank alike (--fault sp-average-biases) passed. So check_whole also
// runs the split layers themselves in float32 and holds them to the whole float32 model within this share
// of each tensor's 16-bit floor: the two add the same products in another order, in float32, whose unit
// roundoff is 2^-16 of bf16's and 2^-13 of fp16's. Measured on 2026-11-30 over the same 30 runs of 1000
// steps (scripts/noise_floor_margins.sh --sixteen-bit): a correct step's split layers came at most 0.010
// of a floor from the whole model (TP 2 x PP 2 in fp16), every other run within 0.0085; the share is six
// times that. The halved biases came 10 floors away at step 457, where the 16-bit check passed
// them, 160 times the share.
constexpr double kSplitFloat32FloorShare = 1.0 / 16;
// Lockstep::check_emulated holds a 16-bit run's parts to the same parts computed without a 16-bit kernel.
// On the CPU no tolerance: its 16-bit kernels are the float32 ones on the widened values, rounded once,
// as the emulation computes (correct runs of chapters 04, 05, 06 and 08, bf16 and fp16, 300 steps, with
// accumulation, recomputation, 16-bit sums and hooks: every part the emulation's bits, 2026-11-29; 08's
// TP, SP and CP grids too, 2026-11-29). A
// GPU's 16-bit GEMMs (cuBLAS on tensor cores) add in another order than its float32 ones, so a rounding
// to 16 bits can flip: there the parts' distance (Euclidean, per tensor) is held within this many floors,
// the floor being the emulation's own response to every value moved by one float32 rounding before it
// is rounded, a summation order's effect. Not yet measured on a GPU: the factor is kNoiseFloorFactor's,
// the float32 check's five times its worst correct step. On the CPU in this mode (hold_emulation_to_its_floor),
// 04's GPT came 920 floors away with the cross-entropy reading the next row's target, 9.6 with a GELU
// rounding toward zero (which the CPU's exact comparison catches, and this factor would pass).
constexpr double kEmulatedFloorFactor = 50;
// `factor`: kNoiseFloorFactor, or for the whole model's check of a 16-bit run kWholeModelFloorFactor;
// `stable_elements`: the size from which a tensor's own floor counts (kStableFloorElements, or for
// Euclidean floors kStableEuclideanFloorElements).
std::vector<double> noise_floor_tolerances(const std::vector<double>& floors, const std::vector<double>& largest,
                                           const std::vector<std::int64_t>& elements,
                                           double factor = kNoiseFloorFactor,
                                           std::int64_t stable_elements = kStableFloorElements);

// A 16-bit sum that is wrong in every element by a fraction of its bound (a conversion that truncates
// instead of rounding to nearest, a hook that always rounds up) stays within the elementwise bound
// above, step after step. It shows in the mean. Rounding to nearest errs by as much up as down: over
// the elements i of one reduction, the errors e_i = run_i - reference_i, each measured in its own
// elementwise bound b_i, z_i = e_i / b_i in [-1, 1], have mean zero, and so do z_i sgn(reference_i).
// By Hoeffding's inequality (1963), for errors independent across the n elements,
//     P(|sum_i z_i| >= t) <= 2 exp(-t^2 / (2 n)),
// so a sum beyond t = sqrt(2 ln(2 / p) n) happens to correct rounding with probability at most p.
// Rounding to nearest is unbiased only where the values are spread over many units of the last place:
// below half the smallest subnormal every value rounds to zero, toward zero. So an element may carry a
// legitimate lean of up to the absolute (subnormal) part a_i of its bound, a_i / b_i in z's units, and
// the test allows t + sum_i a_i / b_i; an element whose terms, at the scale the run added them, are all
// below the format's smallest normal number is left out (its a_i is most of its b_i: it could not lean
// past its allowance). A truncating conversion errs toward zero by half a unit in the last place on
// average, a tenth of the bound and more, so its sum grows with n and t with n's square root: over
// the 10^5 elements of a small model's gradient it is beyond t by several times.
// kRoundingBiasFalseAlarm is p, per check: a correct run of 1000 steps fails it with probability at most
// 1e-6.
constexpr double kRoundingBiasFalseAlarm = 1e-9;
class RoundingBias {
 public:
  // One element: the run's value, the reference's, its elementwise bound b_i and the bound's absolute
  // part a_i.
  void add(double run, double reference, double bound, double absolute) {
    if (!(bound > 0)) return;
    const double z = (run - reference) / bound;
    plain_ += z;
    toward_ += reference > 0 ? z : reference < 0 ? -z : 0.0;
    allowed_ += absolute / bound;
    ++elements_;
  }
  std::int64_t elements() const { return elements_; }
  // The larger of |sum z_i| and |sum z_i sgn(reference_i)| over the test's threshold: above 1, the
  // errors lean one way more than rounding to nearest allows.
  double ratio() const;
  double sum() const;        // the larger of the two sums, in absolute value
  double threshold() const;  // t + sum a_i / b_i
  // Which way: "away from zero", "toward zero", "upward" or "downward" (the larger of the two sums).
  const char* direction() const;

 private:
  double plain_ = 0, toward_ = 0, allowed_ = 0;
  std::int64_t elements_ = 0;
};

// A gradient's norm computed, as the run's clipping computes it, from `partial_sums` sums of squares
// (one per rank that holds a part, each in double, sent in float32 and added in float32), against the
// same norm computed in double from the whole gradient: every partial sum is rounded once and the
// partial_sums - 1 additions of positive terms round once each, so the sum of squares is within
// gamma(2 partial_sums) of the exact one, relatively, and its square root within half that, plus the
// rounding of the root.
double norm_bound(double norm, std::int64_t partial_sums);

}  // namespace course::verify
