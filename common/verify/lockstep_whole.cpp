// The lock-step check against the whole, unsplit model: the run's gradient and loss within the whole
// model's own 16-bit floor (Lockstep::check_whole).
#include "common/verify/lockstep.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <utility>

#include "common/autograd/autograd.h"
#include "common/comm/agree.h"
#include "common/kernels/half.h"
#include "common/kernels/kernels.h"
#include "common/optim/optimizer.h"
#include "common/parallel/replicas.h"
#include "common/verify/contribution_magnitudes.h"
#include "common/verify/lockstep_internal.h"

namespace course::verify {

using namespace detail;

void Lockstep::check_whole(std::int64_t step, float run_loss, const PrecisionPieceFunction& piece, DType reduce_dtype,
                           std::size_t parts, double scale, const PartFunction& split_in_float32) {
  MemoryCategoryOverride verification(MemoryCategory::verification);
  const auto count = static_cast<std::size_t>(reference_->parameter_count());
  // [float32, 16 bits, the split layers in float32, loss in float32, in 16 bits], added over the ranks.
  std::vector<float> all(3 * count + 2, 0.0f);
  for (bool sixteen_bits : {false, true}) {
    reference_->zero_grad();
    all[3 * count + (sixteen_bits ? 1 : 0)] = piece(*reference_, sixteen_bits);
    const auto g = reference_->gradients_to_host();
    std::copy(g.begin(), g.end(), all.begin() + static_cast<long>(sixteen_bits ? count : 0));
  }
  // This rank's parts through the split layers in float32, added in double as check_parts adds them.
  std::vector<double> split(split_in_float32 ? count : 0, 0.0);
  const int me = group_ ? group_->rank() : 0;
  for (std::size_t r = static_cast<std::size_t>(me); split_in_float32 && r < parts; r += static_cast<std::size_t>(ranks())) {
    reference_->zero_grad();
    split_in_float32(*reference_, r);
    const auto g = reference_->gradients_to_host();
    for (std::size_t i = 0; i < count; ++i) split[i] += scale * g[i];
  }
  for (std::size_t i = 0; i < split.size(); ++i) all[2 * count + i] = static_cast<float>(split[i]);
  reduce(all);
  if (!judges() || skipping_) return;  // a skipped float16 step: check_parts judged its overflow
  // The whole model's float16 parts may overflow where the run's, split, do not: no floor this step.
  if (!finite(all.begin() + static_cast<long>(count), all.begin() + static_cast<long>(2 * count))) return;
  if (is_16bit(reduce_dtype))  // the run's sums end in the reduce type, with the parts' loss scale
    for (std::size_t i = count; i < 2 * count; ++i) {
      const float scaled = static_cast<float>(all[i] * loss_scale_);
      const float rounded = reduce_dtype == DType::bfloat16 ? half::from_bfloat16(half::to_bfloat16(scaled))
                                                    : half::from_float16(half::to_float16(scaled));
      all[i] = static_cast<float>(rounded / loss_scale_);
    }
  const auto named = reference_->named_parameters();
  std::vector<double> floors, norms, diffs;
  std::vector<std::int64_t> elements;
  std::size_t at = 0;
  for (const auto& [name, p] : named) {
    const auto n = static_cast<std::size_t>(p.numel());
    double floor = 0, norm = 0, diff = 0;
    for (std::size_t i = at; i < at + n; ++i) {
      const double exact = all[i], sixteen = all[count + i] - exact, run = run_gradient_[i] - exact;
      floor += sixteen * sixteen, norm += exact * exact, diff += run * run;
    }
    // Remembered relative to the tensor's gradient: a rounding moves each element by a share of its size,
    // and the gradient falls tenfold in the first steps, where a floor remembered as it was measured held a
    // later step to an earlier, larger gradient's (25 of them came to the whole tensor, compare.h).
    norm = std::sqrt(norm);
    const double relative = norm > 0 ? std::sqrt(floor) / norm : 0.0;
    floors.push_back(whole_floors_.remember(floors.size(), relative) * norm);
    norms.push_back(norm), diffs.push_back(std::sqrt(diff)), elements.push_back(p.numel());
    at += n;
  }
  const auto tolerances = noise_floor_tolerances(floors, norms, elements, kWholeModelFloorFactor, kStableEuclideanFloorElements);
  for (std::size_t t = 0; t < named.size(); ++t) {
    const double ratio = ratio_of(diffs[t], tolerances[t]);
    summary_.worst_whole_ratio = std::max(summary_.worst_whole_ratio, ratio);
    if (!(ratio <= 1))
      record(step, text("the gradient of '%s' is %.3g (Euclidean) from the whole model's in float32, which the whole "
                        "model in the run's precision comes within %.3g of (tolerance %.3g, %g such floors)",
                        named[t].first.c_str(), diffs[t], floors[t], tolerances[t], kWholeModelFloorFactor));
  }
  const double exact = all[3 * count];
  const double floor = whole_floors_.remember(named.size(), std::fabs(static_cast<double>(all[3 * count + 1]) - exact));
  const double tolerance = kWholeModelLossFloorFactor * std::max(floor, kUnitRoundoff * std::fabs(exact));
  const double diff = std::fabs(static_cast<double>(run_loss) - exact);
  summary_.worst_whole_loss_ratio = std::max(summary_.worst_whole_loss_ratio, ratio_of(diff, tolerance));
  if (!(diff <= tolerance))
    record(step, text("the loss is %.9g; the whole model gives %.9g in float32, %.9g in the run's precision "
                      "(tolerance %.3g)", run_loss, exact, all[3 * count + 1], tolerance));
  if (!split_in_float32) return;
  // The split layers' own code in float32 against the whole model in float32: the same sums in another
  // order, float32's roundings, which move the gradient far less than the 16-bit floor (compare.h).
  at = 0;
  for (std::size_t t = 0; t < named.size(); ++t) {
    const auto n = static_cast<std::size_t>(named[t].second.numel());
    double distance = 0;
    for (std::size_t i = at; i < at + n; ++i) {
      const double d = static_cast<double>(all[2 * count + i]) - all[i];
      distance += d * d;
    }
    at += n;
    distance = std::sqrt(distance);
    const double bound = kSplitFloat32FloorShare * tolerances[t] / kWholeModelFloorFactor;
    summary_.worst_split_ratio = std::max(summary_.worst_split_ratio, ratio_of(distance, bound));
    if (!(distance <= bound))
      record(step, text("the split layers in float32 give the gradient of '%s' %.3g (Euclidean) from the whole "
                        "model's in float32, where the same sums in another order in float32 stay within %.3g "
                        "(1/%g of the 16-bit floor, %.3g)",
                        named[t].first.c_str(), distance, bound, 1 / kSplitFloat32FloorShare,
                        tolerances[t] / kWholeModelFloorFactor));
  }
}

}  // namespace course::verify
