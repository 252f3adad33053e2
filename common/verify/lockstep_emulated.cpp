// The lock-step check of a 16-bit run's parts against the same parts computed without one 16-bit kernel
// (Lockstep::check_emulated).
#include "common/verify/lockstep.h"

#include <cmath>
#include <optional>
#include <stdexcept>

#include "common/kernels/kernels.h"
#include "common/ops/autocast.h"
#include "common/verify/lockstep_internal.h"

namespace course::verify {

using namespace detail;

void Lockstep::check_emulated(std::int64_t step, std::size_t parts, double scale, const PartFunction& part) {
  MemoryCategoryOverride verification(MemoryCategory::verification);
  const auto named = reference_->named_parameters();
  const std::size_t tensors = named.size();
  const auto count = static_cast<std::size_t>(reference_->parameter_count());
  // This rank's parts emulated, as is and nudged, added as check_parts added their 16-bit gradients (sum_).
  std::vector<double> emulated[2] = {std::vector<double>(count, 0.0), std::vector<double>(count, 0.0)};
  double losses[2] = {0, 0};
  const int me = group_ ? group_->rank() : 0;
  // On the CPU the 16-bit kernels are the float32 ones on the widened values, rounded once, which is what
  // the emulation computes: the same bits, no floor to measure. A GPU's 16-bit GEMMs add in another order
  // than its float32 ones: there the floor.
  const bool exact = reference_->parameters().front().device() == Device::cpu && !emulation_to_floor_;
  if (emulate_kernels_ && !exact)
    throw std::logic_error("check_emulated: the 16-bit kernels are emulated on the CPU only, and exactly");
  for (int nudge = 0; nudge < (exact ? 1 : 2); ++nudge)
    for (std::size_t r = static_cast<std::size_t>(me); r < parts; r += static_cast<std::size_t>(ranks())) {
      reference_->zero_grad();
      std::optional<EmulatedSixteenBits> emulation;
      std::optional<EmulatedHalfKernels> without_half_kernels;
      if (emulate_kernels_)
        without_half_kernels.emplace();
      else if (nudge)  // every value one float32 rounding up or down (by its index) before it is rounded
        emulation.emplace([step](const Tensor& value) {
          return Tensor::from_host(nudged(value.to_host(), step), value.shape(), value.device());
        });
      else
        emulation.emplace();
      losses[nudge] += scale * part(*reference_, r);
      const auto g = reference_->gradients_to_host();
      for (std::size_t i = 0; i < count; ++i) emulated[nudge][i] += scale * g[i];
    }
  // Per tensor, this rank's squared distances, added over the ranks: [16-bit from emulated, emulated from
  // nudged, emulated's own square], then the loss's two distances and its size.
  std::vector<float> all(3 * tensors + 3, 0.0f);
  std::size_t at = 0;
  for (std::size_t t = 0; t < tensors; ++t) {
    double diff = 0, floor = 0, norm = 0;
    for (std::size_t i = at; i < at + static_cast<std::size_t>(named[t].second.numel()); ++i) {
      const double d = sum_[i] - emulated[0][i], f = emulated[0][i] - emulated[1][i];
      diff += d * d, floor += f * f, norm += emulated[0][i] * emulated[0][i];
    }
    all[t] = static_cast<float>(diff), all[tensors + t] = static_cast<float>(floor), all[2 * tensors + t] = static_cast<float>(norm);
    at += static_cast<std::size_t>(named[t].second.numel());
  }
  all[3 * tensors] = static_cast<float>(std::fabs(parts_loss_ - losses[0]));
  all[3 * tensors + 1] = static_cast<float>(std::fabs(losses[0] - losses[1]));
  all[3 * tensors + 2] = static_cast<float>(std::fabs(losses[0]));
  reduce(all);
  if (!judges() || skipping_) return;  // a skipped float16 step: check_parts judged its overflow
  if (exact) {
    for (std::size_t t = 0; t < tensors; ++t)
      if (!(all[t] == 0)) {
        summary_.worst_emulated_ratio = INFINITY;
        record(step, text("the 16-bit kernels' gradient of '%s' is %.3g (Euclidean, over the parts) from the same parts "
                          "computed without them, in float32 with the 16-bit roundings emulated, whose bits they must "
                          "be on the CPU (its 16-bit kernels are the float32 ones on the widened values, rounded once)",
                          named[t].first.c_str(), std::sqrt(static_cast<double>(all[t]))));
        return;
      }
    if (!(all[3 * tensors] == 0)) {
      summary_.worst_emulated_ratio = INFINITY;
      record(step, text("the 16-bit kernels' loss is %.3g from the same parts' computed without them, whose bits it must "
                        "be on the CPU", static_cast<double>(all[3 * tensors])));
    }
    return;
  }
  if (!finite(all.begin() + static_cast<long>(tensors), all.end())) return;  // the emulation overflowed: no floor
  std::vector<double> floors, norms, diffs;
  std::vector<std::int64_t> elements;
  for (std::size_t t = 0; t < tensors; ++t) {
    floors.push_back(emulated_floors_.remember(t, std::sqrt(static_cast<double>(all[tensors + t]))));
    norms.push_back(std::sqrt(static_cast<double>(all[2 * tensors + t])));
    diffs.push_back(std::sqrt(static_cast<double>(all[t])));
    elements.push_back(named[t].second.numel());
  }
  const auto tolerances = noise_floor_tolerances(floors, norms, elements, kEmulatedFloorFactor);
  for (std::size_t t = 0; t < tensors; ++t) {
    const double ratio = ratio_of(diffs[t], tolerances[t]);
    summary_.worst_emulated_ratio = std::max(summary_.worst_emulated_ratio, ratio);
    if (!(ratio <= 1))
      record(step, text("the 16-bit kernels' gradient of '%s' is %.3g (Euclidean, over the parts) from the same parts "
                        "computed without them, in float32 with the 16-bit roundings emulated (tolerance %.3g: %g x "
                        "the emulation's own response to one float32 rounding before each, %.3g)",
                        named[t].first.c_str(), diffs[t], tolerances[t], kEmulatedFloorFactor, floors[t]));
  }
  const double floor = emulated_floors_.remember(tensors, static_cast<double>(all[3 * tensors + 1]));
  const double tolerance = kEmulatedFloorFactor * std::max(floor, kUnitRoundoff * all[3 * tensors + 2]);
  const double diff = all[3 * tensors];
  summary_.worst_emulated_ratio = std::max(summary_.worst_emulated_ratio, ratio_of(diff, tolerance));
  if (!(diff <= tolerance))
    record(step, text("the 16-bit kernels' loss is %.3g from the same parts' computed without them (tolerance %.3g)",
                      diff, tolerance));
}

}  // namespace course::verify
