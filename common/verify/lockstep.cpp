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
#include "common/verify/lockstep_internal.h"

namespace course::verify {

using namespace detail;

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
                                      static_cast<float>(summary_.worst_whole_loss_ratio),
                                      static_cast<float>(summary_.worst_emulated_ratio),
                                      static_cast<float>(summary_.worst_split_ratio)},
                                     {13}, reference_->parameters().front().device());
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
  summary_.worst_emulated_ratio = v[11];
  summary_.worst_split_ratio = v[12];
  return summary_;
}

void Lockstep::check_replicas(std::int64_t step, const std::vector<float>& mine, comm::Communicator& replicas,
                              const char* what) {
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
    record(0, text("rank %d starts from other %s than its replicas (the same initialisation or checkpoint must "
                   "give every replica the same bits)", rank, what));
  else
    record(step - 1, text("after the update of step %lld, rank %d holds other %s than its replicas (only rank 0's "
                          "are compared with the reference, so every replica must hold its bits)",
                          static_cast<long long>(step - 1), rank, what));
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

std::vector<float> optimizer_state(const optim::Optimizer& optimizer, const std::function<bool(const Tensor&)>& keep) {
  std::vector<float> values;
  for (const auto& [name, tensor] : optimizer.state()) {
    if (keep && !keep(optimizer.parameter_of(name))) continue;
    const auto host = tensor.to_host();
    values.insert(values.end(), host.begin(), host.end());
  }
  return values;
}

}  // namespace course::verify
