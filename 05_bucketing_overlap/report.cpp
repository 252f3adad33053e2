// Chapter 05's table, metrics and timeline.
#include "05_bucketing_overlap/report.h"

#include <cstdio>

#include <nlohmann/json.hpp>

#include "05_bucketing_overlap/prediction.h"

#include "common/core/log.h"
#include "common/metrics/trace.h"
#include "common/parallel/replicas.h"  // on_rank0
#include "common/verify/compare.h"

namespace course::chapter05 {

void print_table_header() {
  log("%-16s %8s %10s %10s %10s %12s  %s\n", "mode", "buckets", "step(ms)", "compute", "exposed", "MB/step", "check");
}

bool report_mode(const Options& o, const std::string& name, const ModeResult& r, const std::vector<float>& first,
                 int ranks, std::int64_t global_batch, const std::string& label, metrics::MetricsWriter& metrics) {
  const double diff = first.empty() ? 0.0 : verify::max_abs_diff(r.parameters, first);
  const bool ok = r.check.passed;
  const std::string check = !o.verify ? "(not verified)" : ok ? "PASSED" : "FAILED at step " + std::to_string(r.check.first_failed_step);
  char differs[64] = "";
  if (diff > 0) std::snprintf(differs, sizeof differs, "; final weights %.2g from per-parameter's", diff);
  log("%-16s %8zu %10.2f %10.2f %10.2f %12.2f  %s%s\n", name.c_str(), r.messages, r.step_ms, r.step_ms - r.exposed_ms,
      r.exposed_ms, static_cast<double>(r.bytes_per_step) / 1e6, check.c_str(), differs);
  if (o.verify && !ok) log("  %s\n", r.check.first_failure.c_str());
  nlohmann::json predicted = nlohmann::json::object();
  if (!o.predict.empty()) {  // --predict: the cost model's price of the same mode
    const ModePrediction p = predict_mode(o, prediction_calibration(o), name, ranks, global_batch);
    log("  the course's model: %zu buckets, step %.2f ms = compute %.2f + exposed %.2f (predicted/measured step %.2f)\n",
        static_cast<std::size_t>(p.buckets), p.compute_ms + p.exposed_ms, p.compute_ms, p.exposed_ms,
        (p.compute_ms + p.exposed_ms) / r.step_ms);
    predicted = {{"predicted_compute_ms", p.compute_ms}, {"predicted_exposed_ms", p.exposed_ms},
                 {"predicted_buckets", p.buckets}};
  }
  nlohmann::json record = {{"event", "mode"},
                 {"mode", name},
                 {"buckets", r.messages},
                 {"step_ms", r.step_ms},
                 {"compute_ms", r.step_ms - r.exposed_ms},
                 {"exposed_ms", r.exposed_ms},
                 {"bytes_per_step", r.bytes_per_step},
                 {"verified", o.verify},
                 {"passed", ok},
                 {"gradient_bound_ratio", r.check.worst_gradient_ratio},
                 {"rounding_bias_ratio", r.check.worst_bias_ratio},
                 {"emulated_ratio", r.check.worst_emulated_ratio},
                 {"first_failed_step", r.check.first_failed_step},
                 {"diff_vs_per_parameter", diff},
                 {"ranks", ranks},
                 {"simulated_network", label},
                 {"comm_hook", o.comm_hook}};
  record.update(predicted);
  metrics.write(record);
  return ok;
}

void write_trace(const Options& o, comm::Communicator& group, const parallel::Timeline& mine, const std::string& label) {
  std::vector<float> packed;
  for (const auto& i : mine.compute)
    packed.insert(packed.end(), {static_cast<float>(i.begin_ms), static_cast<float>(i.end_ms)});
  for (const auto& i : mine.communication)
    packed.insert(packed.end(), {static_cast<float>(i.begin_ms), static_cast<float>(i.end_ms)});
  Tensor local = Tensor::from_host(packed, {static_cast<std::int64_t>(packed.size())});
  Tensor all = Tensor::zeros({static_cast<std::int64_t>(packed.size()) * group.size()});
  group.all_gather(local, all);  // every rank's timeline has the same shape: the same layers and buckets
  if (o.trace.empty()) return;
  parallel::on_rank0(group, [&] {  // a full disk ends every rank alike, with one line
    auto values = all.to_host();
    metrics::ChromeTrace trace;
    trace.label(label);
    for (int r = 0; r < group.size(); ++r) {
      std::size_t at = static_cast<std::size_t>(r) * packed.size();
      for (const auto& i : mine.compute) {
        trace.add(r, "backward compute", "layer " + i.name, values[at], values[at + 1]);
        at += 2;
      }
      for (const auto& i : mine.communication) {
        trace.add(r, label.empty() ? "all-reduce" : "all-reduce (simulated)", i.name, values[at], values[at + 1]);
        at += 2;
      }
    }
    trace.write(o.trace);
    log("timeline of the last overlapped step written to %s (open it in ui.perfetto.dev)\n", o.trace.c_str());
  });
}

std::string why_overlap_gains_little(Device device, const std::string& backend, const std::string& label) {
  if (device == Device::cpu)
    return std::string("overlap gains little here: the transfer itself takes the CPU that backward needs (a rank's "
                       "copy through shared memory, on ") +
           (label.empty() ? "the cores backward runs on" : "the cores backward runs on, beneath the simulated delay") +
           "); with a network's delay that costs no CPU (--sim-network 10,1.25) it does";
  const std::string simulated = "; with a network's delay that costs the GPU nothing (--sim-network 10,1.25) it does";
  if (backend == "nccl")
    return "overlap gains little here: the buckets travel on NCCL's own stream beside backward's, but there is "
           "little to hide (one rank has nothing to send; ranks on one node move a bucket in microseconds)" + simulated;
  return "overlap gains little here: the ranks share the GPU, and the MPI backend stages each bucket through the "
         "host, a copy queued on the stream backward computes on, so the two take turns instead of overlapping "
         "(on NCCL, a GPU per rank, the buckets have a stream of their own)" + simulated;
}

}  // namespace course::chapter05
