// Chapter 07's measurements against the formulas, the verdict, and the files it writes.
#include "07_zero/report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "07_zero/verify_zero.h"

#include "common/checkpoint/safetensors.h"
#include "common/checkpoint/sharded.h"
#include "common/core/errors.h"
#include "common/core/log.h"
#include "common/parallel/replicas.h"

namespace course::chapter07 {

double ring_theory(int stage, double psi, int n, DType precision) {
  return (stage == 3 ? 3 : 2) * static_cast<double>(element_size(precision)) * psi * (n - 1) / n;
}
parallel::ZeroOptimizer::HostTraffic host_traffic_theory(int stage, double psi, int n, DType precision,
                                                         parallel::ZeroOptions::Offload offload) {
  using Offload = parallel::ZeroOptions::Offload;
  if (offload == Offload::none) return {};
  const double part = static_cast<double>(element_size(precision)) * (stage == 0 ? psi : psi / n);
  return {static_cast<std::int64_t>(part), static_cast<std::int64_t>((offload == Offload::parameters ? 2 : 1) * part)};
}

StageRun begin_run(Device device) {
  StageRun run;
  run.device = device;
  run.device_before = memory_stats(device), run.host_before = memory_stats(Device::cpu);
  return run;
}

void record_step(const Options& o, StageRun& run, const parallel::ZeroOptimizer& zero, std::int64_t step, float loss,
                 double ms, double norm) {
  if (step > 0 || o.training.steps == 1) run.timed_ms += ms;
  run.losses.push_back(loss);
  if (run.ring_bytes == 0 && std::isfinite(norm)) {  // a step taken whole
    run.ring_bytes = zero.ring_bytes_last_step();
    run.host_traffic = zero.host_traffic_last_step();
  }
  if (!o.compare && (step % o.log_every == 0 || step + 1 == o.training.steps))
    log("step %4lld  loss %.6f  %.2f ms\n", static_cast<long long>(step), loss, ms);
}

void finish_run(const Options& o, StageRun& run, parallel::ZeroOptimizer& zero, verify::StepCheck& check, bool save,
                const nn::Module& model, comm::Communicator& group, Device device, metrics::MetricsWriter& metrics) {
  run.stage = zero.options().stage;
  run.prefetch = zero.options().prefetch && run.stage == 3;
  run.psi = static_cast<double>(model.parameter_count());
  run.step_ms = run.timed_ms / static_cast<double>(std::max<std::int64_t>(1, o.training.steps - run.first_step - 1));
  run.precision = zero.options().precision;
  run.skipped_steps = zero.scaler().skipped_steps();
  const MemoryStats after = memory_stats(device), host_after = memory_stats(Device::cpu);  // before the gather
  run.offload = zero.options().offload;
  run.parameters = zero.full_parameters();
  if (check.checks()) run.check = check.finish();
  if (save && !o.save.empty()) save_gathered(o, run, model, group);
  measure(run, {run.device_before, after}, {run.host_before, host_after}, group.size(), o.sim_network, metrics);
}

void measure(StageRun& run, const Snapshots& device, const Snapshots& host, int ranks, const std::string& sim_network,
             metrics::MetricsWriter& metrics) {
  const int stage = run.stage;
  const MemoryStats &before = device.before, &after = device.after;
  run.host_bytes = host.after.current_of(MemoryCategory::offloaded) - host.before.current_of(MemoryCategory::offloaded);
  auto held = [&](MemoryCategory c) { return after.current_of(c) - before.current_of(c); };
  run.params_bytes = held(MemoryCategory::parameters);
  run.grads_bytes = held(MemoryCategory::gradients);
  run.adam_bytes = held(MemoryCategory::optimizer_state);
  run.peak_activations = after.peak_of(MemoryCategory::activations) - before.current_of(MemoryCategory::activations);
  run.peak_communication = after.peak_of(MemoryCategory::communication) - before.current_of(MemoryCategory::communication);
  const Tensor gathered = Tensor::from_host(run.parameters, {static_cast<std::int64_t>(run.parameters.size())});
  run.checksum = parallel::parameter_checksum({gathered});
  const planner::ModelStates f = planner::zero_model_states(stage, run.psi, ranks, run.precision, run.offload);
  const auto traffic = host_traffic_theory(stage, run.psi, ranks, run.precision, run.offload);
  run.record = {{"event", "zero_stage"}, {"stage", stage}, {"ranks", ranks}, {"parameters", run.psi},
                 {"params_bytes", run.params_bytes}, {"grads_bytes", run.grads_bytes}, {"adam_bytes", run.adam_bytes},
                 {"formula_params", f.params}, {"formula_grads", f.grads}, {"formula_adam", f.optimizer},
                 {"offload", parallel::offload_name(run.offload)}, {"host_bytes", run.host_bytes}, {"formula_host", f.host},
                 {"host_down_bytes", run.host_traffic.down}, {"host_up_bytes", run.host_traffic.up},
                 {"host_down_theory", traffic.down}, {"host_up_theory", traffic.up},
                 {"peak_activations", run.peak_activations}, {"peak_communication", run.peak_communication},
                 {"ring_bytes", run.ring_bytes}, {"ring_theory", ring_theory(stage, run.psi, ranks, run.precision)},
                 {"precision", dtype_name(run.precision)}, {"skipped_steps", run.skipped_steps},
                 {"step_ms", run.step_ms}, {"final_loss", run.losses.empty() ? 0.0f : run.losses.back()},
                 {"checksum", run.checksum},
                 {"first_step", run.first_step}, {"prefetch", run.prefetch},
                 {"simulated_network", sim_network.empty() ? "" : "simulated " + sim_network}};
  metrics.write(run.record);
}

void save_gathered(const Options& o, const StageRun& run, const nn::Module& model, comm::Communicator& group) {
  parallel::on_rank0(group, [&] {  // every rank holds the gathered parameters: rank 0 writes them
    checkpoint::NamedTensors tensors;
    std::size_t at = 0;
    for (const auto& [name, p] : model.named_parameters()) {
      const auto n = static_cast<std::size_t>(p.numel());
      tensors.emplace_back(name, Tensor::from_host(std::vector<float>(run.parameters.begin() + static_cast<long>(at),
                                                                      run.parameters.begin() + static_cast<long>(at + n)),
                                                   p.shape()));
      at += n;
    }
    checkpoint::save_safetensors(o.save, tensors, {{"chapter", "07_zero"}, {"stage", std::to_string(run.stage)},
                                                   {"steps", std::to_string(o.training.steps)}});
    log("parameters saved to %s\n", o.save.c_str());
  });
}

namespace {

// "0.998", or "-" where the formula is 0 (stage 3 with its parameters offloaded keeps no model state on the device).
std::string ratio(double measured, double formula) {
  if (formula == 0) return measured == 0 ? "-" : "inf";
  char text[32];
  std::snprintf(text, sizeof text, "%.3f", measured / formula);
  return text;
}

// ZeRO-Offload: what each rank keeps in host memory, and what a step copies down and up, beside the formulas.
void print_host_table(const std::vector<StageRun>& runs, int ranks) {
  if (runs.front().offload == parallel::ZeroOptions::Offload::none) return;
  log("offloaded to the host per rank (%s; not on the device, not in the totals above):\n",
      runs.front().offload == parallel::ZeroOptions::Offload::optimizer
          ? "float32 masters and Adam's moments, and at stages 2-3 the gradients' part"
          : "float32 masters and Adam's moments, the gradients' and the parameters' parts");
  log("  stage  host         formula      measured/formula  | down per step  theory       up per step  theory\n");
  for (const StageRun& r : runs) {
    const planner::ModelStates f = planner::zero_model_states(r.stage, r.psi, ranks, r.precision, r.offload);
    const auto theory = host_traffic_theory(r.stage, r.psi, ranks, r.precision, r.offload);
    log("  %d%s %-12s %-12s %-17s | %-14s %-12s %-12s %s\n", r.stage, r.prefetch ? "p    " : "     ",
        format_bytes(r.host_bytes).c_str(), format_bytes(static_cast<std::int64_t>(f.host)).c_str(),
        ratio(static_cast<double>(r.host_bytes), f.host).c_str(), format_bytes(r.host_traffic.down).c_str(),
        format_bytes(theory.down).c_str(), format_bytes(r.host_traffic.up).c_str(), format_bytes(theory.up).c_str());
  }
}

}  // namespace

void print_memory_table(const std::vector<StageRun>& runs, int ranks, const std::string& network) {
  const DType precision = runs.front().precision;
  const char* where = runs.front().offload == parallel::ZeroOptions::Offload::none ? "" : " on the device";
  if (precision == DType::float32)
    log("model states per rank%s (float32 AdamW, %d ranks, %.0f parameters):\n", where, ranks, runs.front().psi);
  else
    log("model states per rank%s (%s parameters and gradients, float32 masters and AdamW: 2 + 2 + 12 bytes a "
        "parameter unsharded; %d ranks, %.0f parameters):\n", where, dtype_name(precision), ranks, runs.front().psi);
  log("  stage  parameters   gradients   %s  total       formula     measured/formula  | peak activations  peak comm. buffers\n",
      precision == DType::float32 ? "Adam state" : "masters+Adam");
  for (const StageRun& r : runs) {
    const planner::ModelStates f = planner::zero_model_states(r.stage, r.psi, ranks, r.precision, r.offload);
    const double total = static_cast<double>(r.params_bytes + r.grads_bytes + r.adam_bytes);
    log("  %d%s %-12s %-11s %-11s %-11s %-11s %-17s | %-17s %s\n", r.stage, r.prefetch ? "p    " : "     ",
        format_bytes(r.params_bytes).c_str(), format_bytes(r.grads_bytes).c_str(), format_bytes(r.adam_bytes).c_str(),
        format_bytes(static_cast<std::int64_t>(total)).c_str(), format_bytes(static_cast<std::int64_t>(f.total())).c_str(),
        ratio(total, f.total()).c_str(), format_bytes(r.peak_activations).c_str(), format_bytes(r.peak_communication).c_str());
  }
  print_host_table(runs, ranks);
  log("communication per rank per step (as a ring sends it)%s:\n",
      network.empty() ? "" : ("; step times on a simulated network: " + network).c_str());
  for (const StageRun& r : runs) {
    const double theory = ring_theory(r.stage, r.psi, ranks, r.precision);
    char against[32] = "";
    if (runs.size() > 1) std::snprintf(against, sizeof against, " (%.2fx stage 0's)", r.step_ms / runs.front().step_ms);
    char model[64] = "";
    if (r.predicted_ms > 0)
      std::snprintf(model, sizeof model, "; the course's model %.2f ms (predicted/measured %.2f)", r.predicted_ms,
                    r.predicted_ms / r.step_ms);
    log("  stage %d%s %-11s theory %-11s (%s)  ratio %.3f   step %.2f ms%s%s\n", r.stage, r.prefetch ? "p" : " ",
        format_bytes(r.ring_bytes).c_str(), format_bytes(static_cast<std::int64_t>(theory)).c_str(),
        r.stage == 3 ? "3 psi" : "2 psi", ranks > 1 ? static_cast<double>(r.ring_bytes) / theory : 1.0, r.step_ms,
        against, model);
  }
}

// The lock-step verdict of one stage's run, in one line.
bool report_check(const StageRun& run) {
  const verify::LockstepSummary& c = run.check;
  if (c.passed)
    log("verify stage %d%s, %lld steps in lock-step against the whole model: every averaged gradient within its "
        "%s bound (%.3g of it), every loss (%.3g of its bound), every update AdamW's bit for bit%s%s: PASSED\n",
        run.stage, run.prefetch ? " (prefetching)" : "", static_cast<long long>(c.steps), dtype_name(run.precision),
        c.worst_gradient_ratio, c.worst_loss_ratio,
        is_16bit(run.precision) && run.device == Device::cpu ? ", every part the same without a 16-bit kernel" : "",
        c.skipped_steps > 0 ? (", " + std::to_string(c.skipped_steps) + " overflowed steps skipped by run and reference").c_str()
                            : "");
  else
    log("verify stage %d%s FAILED at step %lld: %s\n", run.stage, run.prefetch ? " (prefetching)" : "",
        static_cast<long long>(c.first_failed_step), c.first_failure.c_str());
  return c.passed;
}

// --consolidate STEP_DIR --save FILE: the shards of a checkpoint as one ordinary safetensors file.
int consolidate(const Options& o) {
  if (o.save.empty()) throw UsageError("--consolidate: needs --save FILE, the file to write");
  try {
    checkpoint::consolidate(o.consolidate, o.save, {{"chapter", "07_zero"}, {"consolidated_from", o.consolidate}});
  } catch (const checkpoint::CheckpointError& e) {
    throw UsageError(std::string("--consolidate: ") + e.what());
  }
  log("consolidated %s into %s\n", o.consolidate.c_str(), o.save.c_str());
  return 0;
}

void suggest_charts(const Options& o) {
  log("charts: python3 scripts/plot.py zero %s PREFIX (PREFIX_memory.png, PREFIX_communication.png)\n",
      o.common.metrics.empty() ? "METRICS (run with --metrics FILE)" : o.common.metrics.c_str());
}

}  // namespace course::chapter07
