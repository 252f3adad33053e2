// Chapter 07's prediction of each stage's step (prediction.h), and price_stages (report.h).
#include "07_zero/prediction.h"

#include <stdexcept>
#include <string>
#include <vector>

#include "07_zero/report.h"
#include "common/core/errors.h"
#include "common/metrics/metrics.h"
#include "common/planner/cost_model.h"

namespace course::chapter07 {

planner::Calibration prediction_calibration(const Options& o) {
  const auto refuse = [](const std::string& why) { throw UsageError("--predict: prices float32 steps of the MLP, " + why); };
  if (o.models.model != "mlp") refuse("not --model " + o.models.model);
  if (o.precision.precision != "fp32") refuse("not --precision " + o.precision.precision);
  if (o.offload != "none") refuse("on the device: not --offload " + o.offload);
  if (o.accum != 1) refuse("one micro-batch a step: not --accum " + std::to_string(o.accum));
  if (!o.sim_network.empty()) refuse("on this machine's link: not --sim-network " + o.sim_network);
  try {
    return planner::read_calibration(o.predict);
  } catch (const std::invalid_argument& e) {
    throw UsageError(std::string("--predict: ") + e.what());
  }
}

double predict_stage_ms(const Options& o, const planner::Calibration& c, int stage, int ranks, std::int64_t global_batch) {
  const planner::TimeBreakdown t = planner::predict_zero_mlp_step(
      {o.mlp.features, o.mlp.hidden, o.mlp.layers}, static_cast<double>(global_batch), ranks, planner::this_machine(c, ranks),
      stage);
  return 1e3 * t.total();
}

void price_stages(const Options& o, std::vector<StageRun>& runs, int ranks, std::int64_t global_batch,
                  metrics::MetricsWriter& metrics) {
  if (o.predict.empty()) return;
  const planner::Calibration c = prediction_calibration(o);
  for (StageRun& run : runs) {
    run.predicted_ms = predict_stage_ms(o, c, run.stage, ranks, global_batch);
    metrics.write({{"event", "zero_prediction"}, {"stage", run.stage}, {"prefetch", run.prefetch}, {"ranks", ranks},
                   {"step_ms", run.step_ms}, {"predicted_step_ms", run.predicted_ms}});
  }
}

}  // namespace course::chapter07
