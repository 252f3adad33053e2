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

void Lockstep::check_whole(std::int64_t step, float run_loss, const PrecisionPieceFunction& piece, DType reduce_dtype) {
  MemoryCategoryOverride verification(MemoryCategory::verification);
  const auto count = static_cast<std::size_t>(reference_->parameter_count());
  // [float32, 16 bits, loss in float32, loss in 16 bits], added over the ranks.
  std::vector<float> all(2 * count + 2);
  for (bool sixteen_bits : {false, true}) {
    reference_->zero_grad();
    all[2 * count + (sixteen_bits ? 1 : 0)] = piece(*reference_, sixteen_bits);
    const auto g = reference_->gradients_to_host();
    std::copy(g.begin(), g.end(), all.begin() + static_cast<long>(sixteen_bits ? count : 0));
  }
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
    floors.push_back(whole_floors_.remember(floors.size(), std::sqrt(floor)));
    norms.push_back(std::sqrt(norm)), diffs.push_back(std::sqrt(diff)), elements.push_back(p.numel());
    at += n;
  }
  const auto tolerances = noise_floor_tolerances(floors, norms, elements, kWholeModelFloorFactor);
  for (std::size_t t = 0; t < named.size(); ++t) {
    const double ratio = ratio_of(diffs[t], tolerances[t]);
    summary_.worst_whole_ratio = std::max(summary_.worst_whole_ratio, ratio);
    if (!(ratio <= 1))
      record(step, text("the gradient of '%s' is %.3g (Euclidean) from the whole model's in float32, which the whole "
                        "model in the run's precision comes within %.3g of (tolerance %.3g, %g such floors)",
                        named[t].first.c_str(), diffs[t], floors[t], tolerances[t], kWholeModelFloorFactor));
  }
  const double exact = all[2 * count];
  const double floor = whole_floors_.remember(named.size(), std::fabs(static_cast<double>(all[2 * count + 1]) - exact));
  const double tolerance = kWholeModelLossFloorFactor * std::max(floor, kUnitRoundoff * std::fabs(exact));
  const double diff = std::fabs(static_cast<double>(run_loss) - exact);
  summary_.worst_whole_loss_ratio = std::max(summary_.worst_whole_loss_ratio, ratio_of(diff, tolerance));
  if (!(diff <= tolerance))
    record(step, text("the loss is %.9g; the whole model gives %.9g in float32, %.9g in the run's precision "
                      "(tolerance %.3g)", run_loss, exact, all[2 * count + 1], tolerance));
}

}  // namespace course::verify
