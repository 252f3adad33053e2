// What chapter 08 reports beside its lesson: each stage's bubble and peak activations, and the last
// step's timeline as a Chrome trace (scripts/plot.py draws it, and the sweep's charts, from the files).
#pragma once
#include <string>

#include "08_tensor_pipeline/grid_training.h"
#include "common/metrics/metrics.h"

namespace course::chapter08 {

// The last step of every stage as a Chrome trace (one row per stage).
void write_timeline(const GridRun& run, const std::string& path, const std::string& label);
// Each stage's bubble against (p-1)/(m+p-1) (interleaved over v chunks: (p-1)/(vm+p-1)) and its peak
// activations, logged and written as `event`.
// `network`: ", simulated network: ..." when --sim-network is on, for every line that shows a time.
void report_stages(const GridRun& run, int m, const std::string& schedule, metrics::MetricsWriter& metrics,
                   const char* event, const std::string& network);

// The run's first lines: its grid, model and batch (the padding context parallelism adds to a sequence,
// the schedule, the precision, the simulated network and the memory budget, where they apply).
void log_start(const Options& o, const ChapterTask& task, const parallel::Topology& topology, const std::string& network,
               const std::string& limit);
// After the run: each stage's bubble (or, without stages, the peak activations), the throughput, the
// context-parallel bytes, fp16's skipped steps, the "throughput" metric and, with --trace, the timeline.
void report_run(const Options& o, const ChapterTask& task, parallel::Topology& topology, const GridRun& run,
                const std::string& network, metrics::MetricsWriter& metrics);

// With --cp: what attention handed the context-parallel group per step on this rank, beside the
// method's formula (ContextParallel::bytes_per_attention, for each of this rank's layers and
// micro-batches), logged and written as a "context_parallel" metric.
void report_context_parallel(const Options& o, const ChapterTask& task, parallel::Topology& topology,
                             const parallel::ContextParallel& cp, std::int64_t bytes_per_step, metrics::MetricsWriter& metrics);

}  // namespace course::chapter08
