// The unsharded reference of --verify, and the comparison part by part.
#include "verify_grid.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "common/core/log.h"
#include "common/data/sampling.h"
#include "common/ops/ops.h"
#include "common/verify/compare.h"

namespace course::chapter08 {
namespace {

struct Reference {
  std::vector<float> losses;
  std::map<std::string, Tensor> parameters;
};

// The whole model trained on the whole global batch, with the grid's optimizer and clipping. With
// `reversed`, each batch's samples come in reverse order: the noise floor's run.
Reference train_reference(const Options& o, const ChapterTask& task, bool reversed) {
  auto model = task.task.make_model(o.common.seed);
  Trainer trainer(model->parameters(), o);
  data::SampleStream stream(task.task.size, o.common.seed);
  Reference r;
  for (std::int64_t step = 0; step < o.steps; ++step) {
    auto samples = stream.take(step * o.global_batch, o.global_batch);
    if (reversed) std::reverse(samples.begin(), samples.end());
    Tensor loss = task.task.loss(*model, samples);
    r.losses.push_back(loss.item());
    loss.backward();
    if (o.clip > 0) optim::clip_grad_norm_(model->parameters(), o.clip);
    trainer.step(step);
  }
  for (const auto& [name, p] : model->named_parameters()) r.parameters[name] = p;
  return r;
}

// The largest difference between any rank's parameter and its part of the reference's, over the grid.
double largest_difference(const parallel::TensorParallelModule& model, const Reference& reference,
                          parallel::Topology& topology) {
  double worst = 0;
  for (const auto& [name, p] : model.named_parameters()) {
    const auto mine = p.to_host(), theirs = model.part_of(name, reference.parameters.at(name)).to_host();
    worst = std::max(worst, verify::max_abs_diff(mine, theirs));
  }
  Tensor t = Tensor::from_host({static_cast<float>(worst)}, {1});
  topology.world().all_reduce(t, comm::ReduceOp::max);
  return t.item();
}

double largest_difference(const std::vector<float>& a, const std::vector<float>& b) { return verify::max_abs_diff(a, b); }

}  // namespace

bool verify_against_unsharded(const Options& o, const ChapterTask& task, const GridRun& run,
                              parallel::Topology& topology, metrics::MetricsWriter& metrics) {
  const Reference reference = train_reference(o, task, false);
  const Reference reordered = train_reference(o, task, true);
  verify::Drift losses{largest_difference(run.losses, reference.losses), largest_difference(reordered.losses, reference.losses)};
  verify::Drift params{largest_difference(*run.model, reference, topology), 0};
  for (const auto& [name, t] : reference.parameters)
    params.noise_floor = std::max(params.noise_floor, verify::max_abs_diff(t.to_host(), reordered.parameters.at(name).to_host()));
  // Runs too short for any noise to show are judged by 1e-3 x lr x steps (the largest movement AdamW
  // can make, a thousandth of it).
  const double tolerance = 1e-3 * o.lr * static_cast<double>(o.steps);
  // And the first steps, before the noise has grown, each within its own tolerance: in a long run the
  // final floor grows as large as a fault's effect.
  const verify::EarlySteps early = verify::check_early_steps(run.losses, reference.losses, reordered.losses, 1e-3 * o.lr);
  const bool passed = params.within(tolerance) && losses.within(tolerance) && early.passed();
  log("verify against the unsharded %s on one rank: parameters within %.3g (noise floor %.3g), losses within %.3g "
      "(noise floor %.3g), the first %zu steps' within %.3g (tolerance %.3g at step %zu): %s\n",
      task.is_gpt() ? "GPT" : "MLP", params.difference, params.noise_floor, losses.difference, losses.noise_floor,
      early.checked, early.difference, early.tolerance, early.worst_step, passed ? "PASSED" : "FAILED");
  metrics.write({{"event", "verify"}, {"param_diff", params.difference}, {"param_floor", params.noise_floor},
                 {"loss_diff", losses.difference}, {"loss_floor", losses.noise_floor},
                 {"early_steps", early.checked}, {"early_diff", early.difference}, {"early_tolerance", early.tolerance},
                 {"passed", passed}});
  return passed;
}

}  // namespace course::chapter08
