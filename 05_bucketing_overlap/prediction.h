// Chapter 05's --predict FILE: what the course's cost model (common/planner) says each mode's step costs on
// this machine, calibrated by FILE (benchmarks/plan --calibrate): the same MLP, share, buckets and link
// (--sim-network's, when given), so the chart can draw it beside the measured one.
#pragma once
#include <cstdint>
#include <string>

#include "05_bucketing_overlap/options.h"
#include "common/planner/calibration.h"

namespace course::chapter05 {

struct ModePrediction {
  double compute_ms = 0, exposed_ms = 0;
  int buckets = 0;
};

// --predict's calibration, read once the flags hold; throws UsageError naming --predict (and the flag it
// cannot price beside: --model gpt, a 16-bit --precision or --comm-hook).
planner::Calibration prediction_calibration(const Options& o);

// Mode `mode` (per-parameter, flat, buckets, buckets+overlap) on `ranks` ranks of this machine.
ModePrediction predict_mode(const Options& o, const planner::Calibration& c, const std::string& mode, int ranks,
                            std::int64_t global_batch);

}  // namespace course::chapter05
