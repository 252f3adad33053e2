// Chapter 07's measurements against the formulas, the verdict, and the files it writes.
#include "07_zero/report.h"

#include <cstdio>

#include "common/checkpoint/safetensors.h"
#include "common/checkpoint/sharded.h"
#include "common/core/errors.h"
#include "common/core/log.h"
#include "common/parallel/replicas.h"

namespace course::chapter07 {

Formula formula(int stage, double psi, int n, DType precision) {
  const double b = static_cast<double>(element_size(precision));         // a parameter, a gradient
  const double k = precision == DType::float32 ? 8 : 12;                  // the paper's K
  return {stage <= 2 ? b * psi : b * psi / n, stage <= 1 ? b * psi : b * psi / n, stage == 0 ? k * psi : k * psi / n};
}
double ring_theory(int stage, double psi, int n, DType precision) {
  return (stage == 3 ? 3 : 2) * static_cast<double>(element_size(precision)) * psi * (n - 1) / n;
}

void measure(StageRun& run, const MemoryStats& before, const MemoryStats& after, int ranks, const std::string& sim_network,
             metrics::MetricsWriter& metrics) {
  const int stage = run.stage;
  auto held = [&](MemoryCategory c) { return after.current_of(c) - before.current_of(c); };
  run.params_bytes = held(MemoryCategory::parameters);
  run.grads_bytes = held(MemoryCategory::gradients);
  run.adam_bytes = held(MemoryCategory::optimizer_state);
  run.peak_activations = after.peak_of(MemoryCategory::activations) - before.current_of(MemoryCategory::activations);
  run.peak_communication = after.peak_of(MemoryCategory::communication) - before.current_of(MemoryCategory::communication);
  const Tensor gathered = Tensor::from_host(run.parameters, {static_cast<std::int64_t>(run.parameters.size())});
  run.checksum = parallel::parameter_checksum({gathered});
  const Formula f = formula(stage, run.psi, ranks, run.precision);
  run.record = {{"event", "zero_stage"}, {"stage", stage}, {"ranks", ranks}, {"parameters", run.psi},
                 {"params_bytes", run.params_bytes}, {"grads_bytes", run.grads_bytes}, {"adam_bytes", run.adam_bytes},
                 {"formula_params", f.params}, {"formula_grads", f.grads}, {"formula_adam", f.adam},
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

void print_memory_table(const std::vector<StageRun>& runs, int ranks, const std::string& network) {
  const DType precision = runs.front().precision;
  if (precision == DType::float32)
    log("model states per rank (float32 AdamW, %d ranks, %.0f parameters):\n", ranks, runs.front().psi);
  else
    log("model states per rank (%s parameters and gradients, float32 masters and AdamW: 2 + 2 + 12 bytes a "
        "parameter unsharded; %d ranks, %.0f parameters):\n", dtype_name(precision), ranks, runs.front().psi);
  log("  stage  parameters   gradients   %s  total       formula     measured/formula  | peak activations  peak comm. buffers\n",
      precision == DType::float32 ? "Adam state" : "masters+Adam");
  for (const StageRun& r : runs) {
    const Formula f = formula(r.stage, r.psi, ranks, r.precision);
    const double total = static_cast<double>(r.params_bytes + r.grads_bytes + r.adam_bytes);
    log("  %d%s %-12s %-11s %-11s %-11s %-11s %.3f             | %-17s %s\n", r.stage, r.prefetch ? "p    " : "     ",
        format_bytes(r.params_bytes).c_str(), format_bytes(r.grads_bytes).c_str(), format_bytes(r.adam_bytes).c_str(),
        format_bytes(static_cast<std::int64_t>(total)).c_str(), format_bytes(static_cast<std::int64_t>(f.total())).c_str(),
        total / f.total(), format_bytes(r.peak_activations).c_str(), format_bytes(r.peak_communication).c_str());
  }
  log("communication per rank per step (as a ring sends it)%s:\n",
      network.empty() ? "" : ("; step times on a simulated network: " + network).c_str());
  for (const StageRun& r : runs) {
    const double theory = ring_theory(r.stage, r.psi, ranks, r.precision);
    char against[32] = "";
    if (runs.size() > 1) std::snprintf(against, sizeof against, " (%.2fx stage 0's)", r.step_ms / runs.front().step_ms);
    log("  stage %d%s %-11s theory %-11s (%s)  ratio %.3f   step %.2f ms%s\n", r.stage, r.prefetch ? "p" : " ",
        format_bytes(r.ring_bytes).c_str(), format_bytes(static_cast<std::int64_t>(theory)).c_str(),
        r.stage == 3 ? "3 psi" : "2 psi", ranks > 1 ? static_cast<double>(r.ring_bytes) / theory : 1.0, r.step_ms,
        against);
  }
}

// The lock-step verdict of one stage's run, in one line.
bool report_check(const StageRun& run) {
  const verify::LockstepSummary& c = run.check;
  if (c.passed)
    log("verify stage %d%s, %lld steps in lock-step against the whole model: every averaged gradient within its "
        "%s bound (%.3g of it), every loss (%.3g of its bound), every update AdamW's bit for bit%s: PASSED\n",
        run.stage, run.prefetch ? " (prefetching)" : "", static_cast<long long>(c.steps), dtype_name(run.precision),
        c.worst_gradient_ratio, c.worst_loss_ratio,
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
