// Chapter 07's --predict FILE: what the course's cost model (common/planner, predict_zero_mlp_step) says a
// step of each stage costs on this machine, calibrated by FILE (scripts/calibrate.sh): the same MLP, share
// and stage, printed and recorded beside the measured step, so the chart can draw the two.
#pragma once
#include <cstdint>

#include "07_zero/options.h"
#include "common/planner/calibration.h"

namespace course::chapter07 {

// --predict's calibration, read once the flags hold; throws UsageError naming --predict and the flag it
// cannot price beside (--model gpt, a 16-bit --precision, --offload, --accum above 1, --sim-network).
planner::Calibration prediction_calibration(const Options& o);

// A step of `stage` on `ranks` ranks of this machine at `global_batch`, in milliseconds.
double predict_stage_ms(const Options& o, const planner::Calibration& c, int stage, int ranks, std::int64_t global_batch);


}  // namespace course::chapter07
