// The lock-step comparison: rank 0 recomputes every part of the step and adds them exactly.
#include "common/verify/lockstep.h"

#include <cmath>
#include <cstdio>
#include <vector>

#include "common/verify/compare.h"

namespace course::verify {
namespace {

// Every parameter's gradient, flattened in registration order (zeros where there is none).
std::vector<float> gradients_to_host(const nn::Module& model) {
  std::vector<float> out;
  for (const auto& [name, p] : model.named_parameters()) {
    Tensor g = p.grad();
    std::vector<float> values = g.defined() ? g.to_host() : std::vector<float>(static_cast<std::size_t>(p.numel()), 0.0f);
    out.insert(out.end(), values.begin(), values.end());
  }
  return out;
}

// Which parameter, and which element of it, flat index i falls in.
std::string locate(const nn::Module& model, std::size_t i) {
  for (const auto& [name, p] : model.named_parameters()) {
    const auto n = static_cast<std::size_t>(p.numel());
    if (i < n) return "'" + name + "'[" + std::to_string(i) + "]";
    i -= n;
  }
  return "?";
}

double ratio_of(double diff, double bound) { return bound > 0 ? diff / bound : (diff == 0 ? 0.0 : INFINITY); }

}  // namespace

LockstepVerifier::LockstepVerifier(std::shared_ptr<nn::Module> reference, comm::Communicator* group)
    : reference_(std::move(reference)), group_(group) {}

void LockstepVerifier::begin_step(const nn::Module& trained) {
  if (group_ && group_->rank() != 0) return;
  auto mine = reference_->named_parameters();
  auto theirs = trained.named_parameters();
  if (mine.size() != theirs.size()) throw std::invalid_argument("LockstepVerifier: the models differ in parameters");
  for (std::size_t i = 0; i < mine.size(); ++i) mine[i].second.copy_from(theirs[i].second);
}

void LockstepVerifier::check(std::int64_t step, const nn::Module& trained, float loss, std::size_t parts, double scale,
                             const PartFunction& part) {
  ++summary_.steps;
  if (group_ && group_->rank() != 0) return;
  const auto count = static_cast<std::size_t>(reference_->parameter_count());
  // The exact combination (in double; its own rounding is ~1e-16, far below the float32 bound) and
  // the sum of the scaled parts' magnitudes, which the bound is proportional to.
  std::vector<double> exact(count, 0.0), magnitude(count, 0.0);
  double exact_loss = 0, loss_magnitude = 0;
  for (std::size_t r = 0; r < parts; ++r) {
    reference_->zero_grad();
    const double part_loss = part(*reference_, r);
    exact_loss += scale * part_loss;
    loss_magnitude += std::fabs(scale * part_loss);
    const auto g = gradients_to_host(*reference_);
    for (std::size_t i = 0; i < count; ++i) {
      exact[i] += scale * g[i];
      magnitude[i] += std::fabs(scale * g[i]);
    }
  }
  // R parts: R-1 additions and the scaling (and in 16 bits, each part's conversion before the sum).
  const bool sixteen_bit = rounding_.unit_roundoff > kUnitRoundoff;
  const auto roundings = static_cast<std::int64_t>(parts) + 1 + (sixteen_bit ? 1 : 0);
  const auto loss_roundings = static_cast<std::int64_t>(parts) + 1;  // the loss is averaged in float32
  auto record = [&](const char* text) {
    if (!summary_.passed) return;
    summary_.passed = false;
    summary_.first_failed_step = step;
    summary_.first_failure = text;
  };
  const auto got = gradients_to_host(trained);
  for (std::size_t i = 0; i < count; ++i) {
    const double diff = std::fabs(static_cast<double>(got[i]) - exact[i]);
    const double bound = summation_bound(magnitude[i], roundings, rounding_);
    summary_.worst_gradient_diff = std::max(summary_.worst_gradient_diff, diff);
    summary_.worst_gradient_ratio = std::max(summary_.worst_gradient_ratio, ratio_of(diff, bound));
    if (!(diff <= bound)) {
      char text[320];
      std::snprintf(text, sizeof text, "gradient of %s is %.9g, the single-rank reference gives %.9g (bound %.3g)",
                    locate(trained, i).c_str(), got[i], exact[i], bound);
      record(text);
    }
  }
  const double diff = std::fabs(static_cast<double>(loss) - exact_loss);
  const double bound = summation_bound(loss_magnitude, loss_roundings);
  summary_.worst_loss_diff = std::max(summary_.worst_loss_diff, diff);
  summary_.worst_loss_ratio = std::max(summary_.worst_loss_ratio, ratio_of(diff, bound));
  if (!(diff <= bound)) {
    char text[320];
    std::snprintf(text, sizeof text, "loss is %.9g, the single-rank reference gives %.9g (bound %.3g)", loss,
                  exact_loss, bound);
    record(text);
  }
}

LockstepSummary LockstepVerifier::finish() {
  if (!group_ || group_->size() == 1) return summary_;
  // Rank 0 judged; everyone learns the verdict and the numbers (the text stays on rank 0, which logs).
  Tensor verdict = Tensor::from_host({summary_.passed ? 1.0f : 0.0f, static_cast<float>(summary_.first_failed_step),
                                      static_cast<float>(summary_.worst_gradient_diff),
                                      static_cast<float>(summary_.worst_gradient_ratio),
                                      static_cast<float>(summary_.worst_loss_diff),
                                      static_cast<float>(summary_.worst_loss_ratio)},
                                     {6});
  group_->broadcast(verdict, 0);
  auto v = verdict.to_host();
  summary_.passed = v[0] == 1.0f;
  summary_.first_failed_step = static_cast<std::int64_t>(v[1]);
  summary_.worst_gradient_diff = v[2];
  summary_.worst_gradient_ratio = v[3];
  summary_.worst_loss_diff = v[4];
  summary_.worst_loss_ratio = v[5];
  return summary_;
}

}  // namespace course::verify
