// Chapter 08's stage figures and timeline.
#include "08_tensor_pipeline/report.h"

#include "common/core/log.h"
#include "common/metrics/trace.h"
#include "common/parallel/pipeline_schedule.h"

namespace course::chapter08 {

void write_timeline(const GridRun& run, const std::string& path, const std::string& label) {
  metrics::ChromeTrace trace;
  trace.label(label);
  const bool chunked = run.stage && run.stage->chunks() > 1;  // interleaved: "F3.1", micro-batch 3 through chunk 1
  for (std::size_t s = 0; s < run.timeline.size(); ++s)
    for (const auto& a : run.timeline[s])
      trace.add(static_cast<int>(s), "stage " + std::to_string(s), parallel::describe(a.action, chunked), a.begin_ms,
                a.end_ms);
  trace.write(path);
  log("timeline: %s (Chrome trace: open it in ui.perfetto.dev, or python3 scripts/plot.py timeline %s PNG)\n",
      path.c_str(), path.c_str());
}

void report_stages(const GridRun& run, int m, const std::string& schedule, metrics::MetricsWriter& metrics,
                   const char* event, const std::string& network) {
  const int p = static_cast<int>(run.bubble.size()), v = run.stage ? run.stage->chunks() : 1;
  const double theory = parallel::bubble_fraction(p, m, v);
  log("pipeline: %d stages%s, %d micro-batches, %s%s; bubble (idle share of the step) against %s = %.3f:\n", p,
      v > 1 ? (" of " + std::to_string(v) + " chunks each").c_str() : "", m, schedule.c_str(), network.c_str(),
      v > 1 ? "(p-1)/(vm+p-1)" : "(p-1)/(m+p-1)", theory);
  for (int s = 0; s < p; ++s) {
    log("  stage %d  bubble %.3f  peak activations %s\n", s, run.bubble[static_cast<std::size_t>(s)],
        format_bytes(static_cast<std::int64_t>(run.peak_activations[static_cast<std::size_t>(s)])).c_str());
    metrics.write({{"event", event}, {"stage", s}, {"stages", p}, {"micro_batches", m}, {"schedule", schedule},
                   {"virtual_stages", v},
                   {"bubble", run.bubble[static_cast<std::size_t>(s)]}, {"theory", theory},
                   {"peak_activation_bytes", run.peak_activations[static_cast<std::size_t>(s)]},
                   {"simulated_network", network.empty() ? "" : "simulated" + network.substr(network.find(':') + 1)}});
  }
}

}  // namespace course::chapter08
