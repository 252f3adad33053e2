// --verify: the unsharded model trained on the whole global batch on one rank, beside the grid's run.
#pragma once
#include "grid_training.h"

namespace course::chapter08 {

// Compares every step's loss and every rank's parameters with their part of the reference, each
// against the reference's noise floor (the same run with each batch in reverse order), and logs the
// verdict. True when both are within verify::kDriftFactor noise floors.
bool verify_against_unsharded(const Options& o, const ChapterTask& task, const GridRun& run,
                              parallel::Topology& topology, metrics::MetricsWriter& metrics);

}  // namespace course::chapter08
