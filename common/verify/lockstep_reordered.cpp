// The lock-step check against the whole batch and its noise floor: each rank's piece computed as it is
// and from nudged parameters, the run within a multiple of that floor (Lockstep::check_reordered).
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

void Lockstep::check_reordered(std::int64_t step, const std::vector<float>& run_gradient, float run_loss,
                               const PieceFunction& piece) {
  MemoryCategoryOverride verification(MemoryCategory::verification);
  const auto count = static_cast<std::size_t>(reference_->parameter_count());
  // [in order, reversed, loss in order, loss reversed], added over the ranks.
  std::vector<float> all(2 * count + 2);
  for (bool reversed : {false, true}) {
    std::vector<float> exact;
    if (reversed) {  // the noise floor's pass: every parameter one rounding away, up or down
      exact = reference_->parameters_to_host();
      reference_->load_parameters_from_host(nudged(exact, step));
    }
    reference_->zero_grad();
    all[2 * count + (reversed ? 1 : 0)] = piece(*reference_, reversed);
    const auto g = reference_->gradients_to_host();
    std::copy(g.begin(), g.end(), all.begin() + static_cast<long>(reversed ? count : 0));
    if (!exact.empty()) reference_->load_parameters_from_host(exact);
  }
  if (!gather_step(all, run_gradient)) return;
  // Per tensor: the floor (in order against nudged and reversed), the largest gradient, the run's difference.
  const auto named = reference_->named_parameters();
  std::vector<double> floors, largest, diffs;
  std::vector<std::int64_t> elements;
  std::vector<std::size_t> worst;
  std::size_t at = 0;
  for (const auto& [name, p] : named) {
    const auto n = static_cast<std::size_t>(p.numel());
    double floor = 0, big = 0, diff = 0;
    std::size_t where = at;
    for (std::size_t i = at; i < at + n; ++i) {
      floor = std::max(floor, std::fabs(static_cast<double>(all[i]) - all[count + i]));
      big = std::max(big, std::fabs(static_cast<double>(all[i])));
      const double d = std::fabs(static_cast<double>(run_gradient[i]) - all[i]);
      if (!(d <= diff)) diff = d, where = i;  // a NaN difference wins
    }
    floors.push_back(floor), largest.push_back(big), diffs.push_back(diff), worst.push_back(where);
    elements.push_back(p.numel());
    at += n;
  }
  // Each tensor's floor: the largest of its last kFloorHistory measurements (compare.h).
  for (std::size_t t = 0; t < named.size(); ++t) floors[t] = floors_.remember(t, floors[t]);
  const auto tolerances = noise_floor_tolerances(floors, largest, elements);
  for (std::size_t t = 0; t < named.size(); ++t) {
    const double diff = diffs[t], tolerance = tolerances[t];
    summary_.worst_floor = std::max(summary_.worst_floor, floors[t]);
    summary_.worst_gradient_diff = std::max(summary_.worst_gradient_diff, std::isnan(diff) ? INFINITY : diff);
    summary_.worst_gradient_ratio = std::max(summary_.worst_gradient_ratio, ratio_of(diff, tolerance));
    if (!(diff <= tolerance))
      record(step, text("the gradient of %s is %.9g; the unsharded reference gives %.9g (tolerance %.3g: %g x the "
                        "step's noise floor on '%s', %.3g)",
                        locate(*reference_, worst[t]).c_str(), run_gradient[worst[t]], all[worst[t]], tolerance,
                        kNoiseFloorFactor, named[t].first.c_str(), tolerance / kNoiseFloorFactor));
  }
  const double floor = floors_.remember(named.size(), std::fabs(static_cast<double>(all[2 * count]) - all[2 * count + 1]));
  // The loss: one number, its floor the one measurement there is.
  const double tolerance = kLossNoiseFloorFactor * std::max(floor, kUnitRoundoff * std::fabs(all[2 * count]));
  const double diff = std::fabs(static_cast<double>(run_loss) - all[2 * count]);
  summary_.worst_loss_diff = std::max(summary_.worst_loss_diff, std::isnan(diff) ? INFINITY : diff);
  summary_.worst_loss_ratio = std::max(summary_.worst_loss_ratio, ratio_of(diff, tolerance));
  if (!(diff <= tolerance))
    record(step, text("the loss is %.9g; the unsharded reference gives %.9g (tolerance %.3g)", run_loss,
                      all[2 * count], tolerance));
}

}  // namespace course::verify
