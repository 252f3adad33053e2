// Chapter 05's prediction of each mode (prediction.h).
#include "05_bucketing_overlap/prediction.h"

#include <stdexcept>

#include "common/comm/simulated_network.h"
#include "common/core/errors.h"
#include "common/planner/cost_model.h"

namespace course::chapter05 {

planner::Calibration prediction_calibration(const Options& o) {
  if (o.models.model != "mlp") throw UsageError("--predict: prices the MLP's modes; --model is " + o.models.model);
  if (o.precision.precision != "fp32")
    throw UsageError("--predict: prices float32 steps; --precision is " + o.precision.precision);
  if (o.comm_hook != "none") throw UsageError("--predict: prices float32 buckets; --comm-hook is " + o.comm_hook);
  try {
    return planner::read_calibration(o.predict);
  } catch (const std::invalid_argument& e) {
    throw UsageError(std::string("--predict: ") + e.what());
  }
}

ModePrediction predict_mode(const Options& o, const planner::Calibration& c, const std::string& mode, int ranks,
                            std::int64_t global_batch) {
  constexpr double kMiB = 1 << 20;  // the caps count MiB, as the Reducer's (and PyTorch's bucket_cap_mb)
  planner::Bucketing how{.average_loss = false};  // per-parameter: a cap of 0, one tensor a bucket
  if (mode == "flat") how.first_cap_bytes = how.cap_bytes = 1e18;
  if (mode == "buckets" || mode == "buckets+overlap") {
    how.first_cap_bytes = o.first_bucket_mb * kMiB;
    how.cap_bytes = o.bucket_mb * kMiB;
    how.overlap = mode == "buckets+overlap";
  }
  if (!o.sim_network.empty()) {  // the simulated network: every all-reduce takes at least its time
    const comm::NetworkModel network = comm::parse_network(o.sim_network);
    how.simulated = planner::Link{network.alpha_us * 1e-6, network.gbps * 1e9};
  }
  const planner::Cluster machine = planner::this_machine(c, ranks);
  const planner::MlpStep step = planner::predict_mlp_step({o.mlp.features, o.mlp.hidden, o.mlp.layers},
                                                          static_cast<double>(global_batch), ranks, machine, how);
  return {1e3 * step.time.compute, 1e3 * step.time.dp, step.buckets};
}

}  // namespace course::chapter05
