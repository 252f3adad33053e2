// The lock-step check: the ranks compute the reference's parts or pieces, rank 0 adds them up, compares
// the gradient and the loss, repeats the run's update and compares the parameters it predicted.
#include "common/verify/lockstep.h"

#include <cmath>
#include <cstdio>
#include <algorithm>
#include <bit>
#include <limits>
#include <utility>

#include "common/autograd/autograd.h"
#include "common/comm/agree.h"
#include "common/kernels/half.h"
#include "common/kernels/kernels.h"
#include "common/optim/optimizer.h"
#include "common/parallel/replicas.h"
#include "common/verify/contribution_magnitudes.h"

namespace course::verify {
namespace {

// Which parameter, and which element of it, flat index i falls in.
std::string locate(const nn::Module& model, std::size_t i) {
  for (const auto& [name, p] : model.named_parameters()) {
    const auto n = static_cast<std::size_t>(p.numel());
    if (i < n) return "'" + name + "'[" + std::to_string(i) + "]";
    i -= n;
  }
  return "?";
}

double ratio_of(double diff, double tolerance) {
  if (std::isnan(diff)) return std::numeric_limits<double>::infinity();
  return tolerance > 0 ? diff / tolerance : (diff == 0 ? 0.0 : std::numeric_limits<double>::infinity());
}

std::string text(const char* format, auto... values) {
  char buffer[400];
  std::snprintf(buffer, sizeof buffer, format, values...);
  return buffer;
}

// Whether every value in [begin, end) is finite.
template <class Iterator>
bool finite(Iterator begin, Iterator end) {
  return std::all_of(begin, end, [](float v) { return std::isfinite(v); });
}

// Every value moved by one unit in the last place, up or down as a hash of its index and the step
// says: a perturbation of every term of the computation by one rounding.
std::vector<float> nudged(std::vector<float> values, std::int64_t step) {
  for (std::size_t i = 0; i < values.size(); ++i) {
    std::uint64_t h = static_cast<std::uint64_t>(i) * 0x9e3779b97f4a7c15ull ^ static_cast<std::uint64_t>(step + 1) * 0xbf58476d1ce4e5b9ull;
    h = (h ^ (h >> 31)) * 0x94d049bb133111ebull;
    values[i] = std::nextafter(values[i], (h >> 63) != 0 ? INFINITY : -INFINITY);
  }
  return values;
}

}  // namespace

std::shared_ptr<nn::Module> make_reference(const std::function<std::shared_ptr<nn::Module>()>& make) {
  MemoryCategoryOverride verification(MemoryCategory::verification);
  return make();
}

Lockstep::Lockstep(std::shared_ptr<nn::Module> reference, UpdateFunction update, comm::Communicator* group,
                   double max_norm)
    : reference_(std::move(reference)), update_(std::move(update)), group_(group), max_norm_(max_norm) {
  if (judges()) predicted_ = reference_->parameters_to_host();
}

void Lockstep::record(std::int64_t step, const std::string& what) {
  if (!summary_.passed) return;  // the first failure is the one worth reading
  summary_.passed = false;
  summary_.first_failed_step = step;
  summary_.first_failure = what;
}

void Lockstep::reduce(std::vector<float>& values) {
  if (!group_ || group_->size() == 1) return;
  const Device device = reference_->parameters().front().device();
  Tensor t = Tensor::from_host(values, {static_cast<std::int64_t>(values.size())}, device);
  group_->reduce(t, 0, comm::ReduceOp::sum);
  if (group_->rank() == 0) values = t.to_host();
}

// Bit for bit: the same parameters, the same gradient and the same optimizer state give the same update.
void Lockstep::compare_parameters(std::int64_t step, const std::vector<float>& run_parameters) {
  if (run_parameters.size() != predicted_.size())
    throw std::invalid_argument("Lockstep: " + std::to_string(run_parameters.size()) + " parameters against the "
                                "reference's " + std::to_string(predicted_.size()));
  for (std::size_t i = 0; i < predicted_.size(); ++i) {
    if (run_parameters[i] == predicted_[i]) continue;
    const std::string where = locate(*reference_, i);
    if (predicted_by_ < 0)
      record(step, text("the run starts from %s = %.9g, the reference from %.9g (the same "
                                  "initialisation or checkpoint must give the same parameters)",
                                  where.c_str(), run_parameters[i], predicted_[i]));
    else
      record(predicted_by_, text("after the update, %s is %.9g; the reference's optimizer, applied to the run's own "
                                 "gradient, gives %.9g",
                                 where.c_str(), run_parameters[i], predicted_[i]));
    return;
  }
}

void Lockstep::begin_step(std::int64_t step, const std::vector<float>& run_parameters) {
  MemoryCategoryOverride verification(MemoryCategory::verification);
  if (judges()) compare_parameters(step, run_parameters);
  // Every rank's reference takes rank 0's view of the run's parameters, so a rank whose own copy
  // differs computes its part from the wrong weights and the sum shows it.
  std::vector<float> values = judges() ? run_parameters : std::vector<float>(predicted_.size());
  if (group_ && group_->size() > 1) {
    const Device device = reference_->parameters().front().device();
    Tensor t = group_->rank() == 0 ? Tensor::from_host(values, {static_cast<std::int64_t>(values.size())}, device)
                                   : Tensor::zeros({reference_->parameter_count()}, device);
    group_->broadcast(t, 0);
    values = t.to_host();
  }
  reference_->load_parameters_from_host(values);
}

bool Lockstep::gather_step(std::vector<float>& all, const std::vector<float>& run_gradient) {
  reduce(all);
  ++summary_.steps;
  if (!judges()) return false;
  const auto count = static_cast<std::size_t>(reference_->parameter_count());
  if (run_gradient.size() != count)
    throw std::invalid_argument("Lockstep: a gradient of " + std::to_string(run_gradient.size()) + " values for " +
                                std::to_string(count) + " parameters");
  run_gradient_ = run_gradient;
  return true;
}

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

void Lockstep::check_update(std::int64_t step, double run_norm) {
  MemoryCategoryOverride verification(MemoryCategory::verification);
  ++summary_.updates;
  if (!judges()) return;
  if (std::exchange(skipping_, false)) {  // the skipped step changes nothing: the prediction stands
    predicted_by_ = step;
    return;
  }
  float factor = 1.0f;
  if (max_norm_ > 0) {
    double squares = 0;
    for (float g : run_gradient_) squares += static_cast<double>(g) * g;
    const double norm = std::sqrt(squares);
    const double bound = norm_bound(norm, ranks());
    if (!(std::fabs(run_norm - norm) <= bound))
      record(step, text("the run clipped by a gradient norm of %.9g; its gradient's norm is %.9g (bound %.3g)",
                        run_norm, norm, bound));
    factor = optim::clip_coefficient(run_norm, max_norm_);
  }
  // The run's gradient, scaled by the run's clipping factor as the run scales it, into the reference.
  std::size_t at = 0;
  for (auto& [name, p] : reference_->named_parameters()) {
    const auto n = static_cast<std::size_t>(p.numel());
    Tensor g = p.grad();
    if (g.defined() && g.device() == Device::cpu) {  // into the gradient the last pass left: no temporary
      std::copy(run_gradient_.begin() + static_cast<long>(at), run_gradient_.begin() + static_cast<long>(at + n), g.data());
    } else {
      g = Tensor::from_host(std::vector<float>(run_gradient_.begin() + static_cast<long>(at),
                                               run_gradient_.begin() + static_cast<long>(at + n)),
                            p.shape(), p.device());
      Tensor param = p;
      param.set_grad(g);
    }
    if (factor != 1.0f) kernels(g.device()).scale(g.data(), factor, g.data(), n);
    at += n;
  }
  // The papers' formulas from the same parameters and gradient (the optimizer's own hyperparameters and,
  // at the first update, its state).
  std::vector<float> expected, gradient;
  if (optimizer_) {
    if (!formulas_) formulas_ = std::make_unique<ReferenceOptimizer>(*optimizer_, *reference_);
    expected = reference_->parameters_to_host();
    gradient = reference_->gradients_to_host();
  }
  update_(step);
  predicted_ = reference_->parameters_to_host();
  predicted_by_ = step;
  if (!optimizer_) return;
  formulas_->step(expected, gradient, optimizer_->lr());
  for (std::size_t i = 0; i < expected.size(); ++i)
    if (std::bit_cast<std::uint32_t>(expected[i]) != std::bit_cast<std::uint32_t>(predicted_[i])) {
      record(step, text("the %s optimizer's update of %s gives %.9g; its paper's formula, from the same parameter and "
                        "gradient, gives %.9g",
                        optimizer_->name().c_str(), locate(*reference_, i).c_str(), predicted_[i], expected[i]));
      break;
    }
}

LockstepSummary Lockstep::finish(const std::vector<float>& final_parameters) {
  MemoryCategoryOverride verification(MemoryCategory::verification);
  if (judges() && predicted_by_ >= 0) compare_parameters(predicted_by_ + 1, final_parameters);
  if (!group_ || group_->size() == 1) return summary_;
  // Rank 0 judged; everyone learns the verdict and the numbers (the text stays on rank 0, which logs).
  Tensor verdict = Tensor::from_host({summary_.passed ? 1.0f : 0.0f, static_cast<float>(summary_.first_failed_step),
                                      static_cast<float>(summary_.worst_gradient_diff),
                                      static_cast<float>(summary_.worst_gradient_ratio),
                                      static_cast<float>(summary_.worst_loss_diff),
                                      static_cast<float>(summary_.worst_loss_ratio),
                                      static_cast<float>(summary_.worst_floor),
                                      static_cast<float>(summary_.skipped_steps),
                                      static_cast<float>(summary_.worst_bias_ratio),
                                      static_cast<float>(summary_.worst_whole_ratio),
                                      static_cast<float>(summary_.worst_whole_loss_ratio)},
                                     {11}, reference_->parameters().front().device());
  group_->broadcast(verdict, 0);
  const auto v = verdict.to_host();
  summary_.passed = v[0] == 1.0f;
  summary_.first_failed_step = static_cast<std::int64_t>(v[1]);
  summary_.worst_gradient_diff = v[2];
  summary_.worst_gradient_ratio = v[3];
  summary_.worst_loss_diff = v[4];
  summary_.worst_loss_ratio = v[5];
  summary_.worst_floor = v[6];
  summary_.skipped_steps = static_cast<std::int64_t>(v[7]);
  summary_.worst_bias_ratio = v[8];
  summary_.worst_whole_ratio = v[9];
  summary_.worst_whole_loss_ratio = v[10];
  return summary_;
}

void Lockstep::check_replicas(std::int64_t step, const std::vector<float>& mine, comm::Communicator& replicas) {
  MemoryCategoryOverride verification(MemoryCategory::verification);
  if (!group_ || group_->size() == 1) return;
  float differs = -1.0f;  // this rank's number in the group when its copy is not its first replica's
  if (replicas.size() > 1) {
    const auto sums = parallel::gather_checksums(replicas, parallel::parameter_checksum(mine));
    if (sums[static_cast<std::size_t>(replicas.rank())] != sums.front()) differs = static_cast<float>(group_->rank());
  }
  differs = comm::all_reduce_scalar(*group_, differs, comm::ReduceOp::max);
  if (!judges() || differs < 0) return;
  const auto rank = static_cast<int>(differs);
  if (predicted_by_ < 0 && step == 0)
    record(0, text("rank %d starts from other parameters than its replicas (the same initialisation or checkpoint must "
                   "give every replica the same bits)", rank));
  else
    record(step - 1, text("after the update of step %lld, rank %d's parameters differ from its replicas' (only rank 0's "
                          "are compared with the reference, so every replica must hold its bits)",
                          static_cast<long long>(step - 1), rank));
}

void Lockstep::begin_step(std::int64_t step, const nn::Module& run) {
  const bool every_rank = group_ && group_->size() > 1;
  const std::vector<float> mine = judges() || every_rank ? run.parameters_to_host() : std::vector<float>();
  begin_step(step, judges() ? mine : std::vector<float>());
  if (every_rank) check_replicas(step, mine, *group_);
}

void Lockstep::check_parts(std::int64_t step, const nn::Module& run, float run_loss, std::size_t parts, double scale,
                           const PartFunction& part) {
  check_parts(step, judges() ? run.gradients_to_host() : std::vector<float>(), run_loss, parts, scale, part);
}

LockstepSummary Lockstep::finish(const nn::Module& run) {
  const std::vector<float> mine = run.parameters_to_host();
  if (group_ && group_->size() > 1) check_replicas(next_step(), mine, *group_);
  return finish(judges() ? mine : std::vector<float>());
}

}  // namespace course::verify
