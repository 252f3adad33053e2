// What chapter 08 measures and reports beside its lessons: each step's time, each stage's bubble and peak
// activations, and the last step's timeline as a Chrome trace (scripts/plot.py draws it, and the sweep's
// charts, from the files).
#pragma once
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "08_tensor_pipeline/grid.h"
#include "common/metrics/metrics.h"
#include "common/parallel/pipeline.h"
#include "common/parallel/pipeline_schedule.h"

namespace course::chapter08 {

// The run's figures: each step's time without --verify's work, the stage's busy time and peak
// activations; at the end gathered into the GridRun on every rank (bubble, peaks, last timelines, the
// slowest rank's mean step).
class StepFigures {
 public:
  explicit StepFigures(std::int64_t steps) : steps_(steps) {}
  void begin_step();
  // `checked_ms`: --verify's own work in the step (StepCheck::take_ms), left out of its time.
  void end_step(std::int64_t step, const parallel::PipelineStep& result, double checked_ms);
  void finish(GridRun& run, parallel::Topology& topology) const;

 private:
  std::int64_t steps_;
  std::chrono::steady_clock::time_point begin_;
  double busy_ms_ = 0, pipeline_ms_ = 0, whole_ms_ = 0;
  parallel::StageTimes work_ms_{0.0, 0.0, 0.0};  // the forwards', backwards' and W's time, summed over the steps
  std::int64_t peak_ = 0;
  std::vector<parallel::TimedAction> last_;
};

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
