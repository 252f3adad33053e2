// The lock-step check by parts: the run's gradient the sum of parts the ranks recompute, within the
// rounding bound of the additions that made it (Lockstep::check_parts).
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

void Lockstep::check_parts(std::int64_t step, const std::vector<float>& run_gradient, float run_loss,
                           std::size_t parts, double scale, const PartFunction& part) {
  MemoryCategoryOverride verification(MemoryCategory::verification);
  const auto count = static_cast<std::size_t>(reference_->parameter_count());
  // This rank's parts, added in double (their own rounding is ~1e-16, far below the float32 bound),
  // with the sum of their magnitudes, which the bound is proportional to: [sum, magnitude, loss, |loss|].
  std::vector<double>& sum = sum_, &magnitude = magnitude_;
  sum.assign(count, 0.0);
  magnitude.assign(count, 0.0);
  double loss = 0, loss_magnitude = 0;
  int terms = 1;  // the most terms a parameter's gradient receives in one part (2 for a tied table)
  const int me = group_ ? group_->rank() : 0;
  for (std::size_t r = static_cast<std::size_t>(me); r < parts; r += static_cast<std::size_t>(ranks())) {
    reference_->zero_grad();
    // A part's gradient may itself be a sum of terms that cancel (a tied table's two uses), which the run
    // may add in another order, across its parts: the magnitude is that of the terms.
    verify::ContributionMagnitudes terms_of;
    const double part_loss = scale * part(*reference_, r);
    terms = std::max(terms, terms_of.most_contributions());
    loss += part_loss;
    loss_magnitude += std::fabs(part_loss);
    const auto g = reference_->gradients_to_host();
    for (std::size_t i = 0; i < count; ++i) sum[i] += scale * g[i];
    std::size_t at = 0;
    for (const Tensor& p : reference_->parameters()) {
      const auto n = static_cast<std::size_t>(p.numel());
      const std::vector<double>* recorded = terms_of.of(p);
      for (std::size_t j = 0; j < n; ++j)
        magnitude[at + j] += std::fabs(scale) * (recorded ? std::max((*recorded)[j], std::fabs(static_cast<double>(g[at + j])))
                                                          : std::fabs(static_cast<double>(g[at + j])));
      at += n;
    }
  }
  parts_loss_ = loss;
  if (group_ && group_->size() > 1) terms = static_cast<int>(comm::all_reduce_scalar(*group_, static_cast<float>(terms), comm::ReduceOp::max));
  std::vector<float>& all = all_;
  all.resize(2 * count + 2);
  for (std::size_t i = 0; i < count; ++i) all[i] = static_cast<float>(sum[i]), all[count + i] = static_cast<float>(magnitude[i]);
  all[2 * count] = static_cast<float>(loss);
  all[2 * count + 1] = static_cast<float>(loss_magnitude);
  if (!gather_step(all, run_gradient)) return;
  // The run: R parts, each of up to `terms` terms that it may add in any order, R terms - 1 additions
  // and the scaling (in 16 bits, each part's conversion too). The reference: its float32 sum over the
  // ranks, one rounding per rank and one for the result.
  const bool sixteen_bit = rounding_.unit_roundoff > kUnitRoundoff;
  const auto run_roundings = static_cast<std::int64_t>(parts) * terms + 1 + (sixteen_bit ? 1 : 0);
  if (!finite(run_gradient.begin(), run_gradient.end())) {
    if (finite(all.begin(), all.begin() + static_cast<long>(count))) {
      // Legitimate only where the run's own sums could overflow: no partial sum of the run exceeds the
      // sum of its parts' magnitudes (the reference's magnitude is that over the whole step, times
      // `scale`), times the loss scale, grown by the sums' roundings.
      const double reach = loss_scale_ / scale * (1 + gamma(run_roundings, rounding_.unit_roundoff));
      for (std::size_t i = 0; i < count; ++i)
        if (!std::isfinite(run_gradient[i]) && !(all[count + i] * reach >= rounding_.largest)) {
          record(step, text("the run's gradient of %s is not finite (%g); the single-rank reference's is %.9g, and no "
                            "sum of its parts can reach %g",
                            locate(*reference_, i).c_str(), run_gradient[i], all[i], rounding_.largest));
          break;
        }
    }
    skipping_ = true;
    ++summary_.skipped_steps;
    return;
  }
  if (!finite(all.begin(), all.begin() + static_cast<long>(count))) {
    record(step, "the single-rank reference's gradient is not finite (its float16 parts overflowed), and the run's is");
    return;
  }
  const auto reference_roundings = static_cast<std::int64_t>(ranks()) + 1;
  // summation_bound(m, r) = gamma(r) m + r x subnormal: its factors once, not per element.
  const double per_magnitude = gamma(run_roundings, rounding_.unit_roundoff) + gamma(reference_roundings);
  // The run adds its parts at the loss scale and divides by it after: where fp16's scale has fallen below 1
  // (steps that overflowed halve it), a rounding in the subnormal range of the scaled sums grows by 1 / scale
  // when undone (a correct MLP run at 10x its learning rate, its scale at 2^-7, came 2.5 such bounds apart).
  const double absolute = (summation_bound(0.0, run_roundings, rounding_) + summation_bound(0.0, reference_roundings)) *
                          std::max(1.0, 1.0 / loss_scale_);
  bool reported = false;
  RoundingBias bias;  // in 16 bits: do the errors lean one way? (compare.h)
  const double smallest_normal = rounding_.subnormal / rounding_.unit_roundoff;  // 2^-14 for fp16, 2^-126 for bf16
  for (std::size_t i = 0; i < count; ++i) {
    const double m = all[count + i];
    const double diff = std::fabs(static_cast<double>(run_gradient[i]) - all[i]);
    const double bound = per_magnitude * m + absolute;
    summary_.worst_gradient_diff = std::max(summary_.worst_gradient_diff, std::isnan(diff) ? INFINITY : diff);
    summary_.worst_gradient_ratio = std::max(summary_.worst_gradient_ratio, ratio_of(diff, bound));
    if (!(diff <= bound) && !reported) {
      record(step, text("the gradient of %s is %.9g; the single-rank reference gives %.9g (bound %.3g)",
                        locate(*reference_, i).c_str(), run_gradient[i], all[i], bound));
      reported = true;
    }
    if (sixteen_bit && m * loss_scale_ >= smallest_normal) bias.add(run_gradient[i], all[i], bound, absolute);
  }
  if (sixteen_bit) {
    summary_.worst_bias_ratio = std::max(summary_.worst_bias_ratio, bias.ratio());
    if (!(bias.ratio() <= 1))
      record(step, text("the 16-bit sum of the gradient errs %s: its %lld errors, each in units of its bound, add up "
                        "to %.3g, where rounding to nearest stays within %.3g but once in %.0g steps (each error within "
                        "its bound, their sum not)",
                        bias.direction(), static_cast<long long>(bias.elements()), bias.sum(), bias.threshold(),
                        1 / kRoundingBiasFalseAlarm));
  }
  const double m = all[2 * count + 1];
  const double diff = std::fabs(static_cast<double>(run_loss) - all[2 * count]);
  const auto loss_roundings = static_cast<std::int64_t>(parts) + 1;  // the loss is averaged in float32
  const double bound = summation_bound(m, loss_roundings) + summation_bound(m, reference_roundings);
  summary_.worst_loss_diff = std::max(summary_.worst_loss_diff, std::isnan(diff) ? INFINITY : diff);
  summary_.worst_loss_ratio = std::max(summary_.worst_loss_ratio, ratio_of(diff, bound));
  if (!(diff <= bound))
    record(step, text("the loss is %.9g; the single-rank reference gives %.9g (bound %.3g)", run_loss,
                      all[2 * count], bound));
}

}  // namespace course::verify
