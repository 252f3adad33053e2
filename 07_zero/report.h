// What chapter 07 measures and reports beside its lesson: each stage's model states against the ZeRO
// paper's formulas and its bytes on the wire against the ring's, the lock-step verdict, the final
// parameters saved as one ordinary file, --consolidate, and how to chart --compare.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "07_zero/options.h"
#include "common/core/memory.h"
#include "common/metrics/metrics.h"
#include "common/nn/module.h"
#include "common/parallel/zero.h"
#include "common/planner/formulas.h"
#include "common/verify/lockstep.h"
#include "common/verify/step_check.h"

namespace course::chapter07 {

struct StageRun {
  int stage = 0;
  bool prefetch = false;        // stage 3 gathered the next unit ahead
  std::int64_t first_step = 0;  // above 0 when resumed: losses[i] is step first_step + i
  std::vector<float> losses, parameters;
  double psi = 0;
  std::int64_t params_bytes = 0, grads_bytes = 0, adam_bytes = 0;  // model states held after a step
  std::int64_t peak_activations = 0, peak_communication = 0;
  std::int64_t ring_bytes = 0;  // per step, as a ring sends it
  parallel::ZeroOptions::Offload offload = parallel::ZeroOptions::Offload::none;
  std::int64_t host_bytes = 0;  // ZeRO-Offload: the state held in host memory after a step
  parallel::ZeroOptimizer::HostTraffic host_traffic;  // per step, device to host and back
  std::uint64_t checksum = 0;   // of the final parameters
  nlohmann::json record;        // the zero_stage metric
  double step_ms = 0;           // without the verification's own work
  double timed_ms = 0;          // the steps' sum that step_ms averages (the first step left out: it allocates)
  double predicted_ms = 0;      // --predict: the course's cost model's step (prediction.h); 0 without
  DType precision = DType::float32;  // of the parameters and gradients (mixed: over float32 masters)
  Device device = Device::cpu;       // where it trained (16 bits on the CPU: its parts checked without 16-bit kernels)
  std::int64_t skipped_steps = 0;    // fp16: steps whose gradients overflowed, skipped
  verify::LockstepSummary check;
  MemoryStats device_before, host_before;  // the counters before the run (begin_run)
};

// The model states per rank are the ZeRO paper's formulas, planner::zero_model_states (one home for them:
// the planner adds them up for configurations no one has run).
// ZeRO-Offload's copies per step: this rank's part of the gradients down to the host, of the
// parameters up (b Psi/N each, b Psi at stage 0), the parameters twice with them offloaded (each unit
// gathered for forward and again for backward; the GPT's root unit, gathered once, makes it a little less).
parallel::ZeroOptimizer::HostTraffic host_traffic_theory(int stage, double psi, int n, DType precision,
                                                         parallel::ZeroOptions::Offload offload);
// The bytes each rank sends per step, as a ring sends them: 2 psi elements (reduce-scatter and
// all-gather, or an all-reduce), 3 psi at stage 3 (the parameters gathered in forward and again in
// backward), of the parameters' type.
double ring_theory(int stage, double psi, int n, DType precision);


// After a stage's run: the model states it holds (`after` against `before`, both taken outside
// anything the report gathers), its peaks, its checksum and the "zero_stage" metric, into `run`, whose
// `parameters` are the final ones, gathered whole.
struct Snapshots {
  MemoryStats before, after;
};
// `device`: the run's device's counters; `host`: the CPU's, where ZeRO-Offload's state is counted (on a
// CPU-only run the same counters).
void measure(StageRun& run, const Snapshots& device, const Snapshots& host, int ranks,
             const std::string& sim_network, metrics::MetricsWriter& metrics);
// A stage's run before it starts: the memory counters (the device's and the host's) that measure()
// compares the run's against.
StageRun begin_run(Device device);
// After each step: its loss and time (`ms`, the check's own work left out), the bytes and host traffic of
// the first step taken whole, and the log line (every --log-every steps and the last, unless --compare).
void record_step(const Options& o, StageRun& run, const parallel::ZeroOptimizer& zero, std::int64_t step, float loss,
                 double ms, double norm);
// After the last step: the stage, the step time, the memory against the formulas and the metric (measure), then
// --verify's last check of the gathered parameters (`check`'s finish, when it checks) and, when `save`, --save.
void finish_run(const Options& o, StageRun& run, parallel::ZeroOptimizer& zero,
                verify::StepCheck& check, bool save, const nn::Module& model, comm::Communicator& group, Device device,
                metrics::MetricsWriter& metrics);
// With --predict: each run's predicted step (StageRun::predicted_ms, which the table prints beside the
// measured one) and a "zero_prediction" metric for it; without, nothing. In prediction.cpp.
void price_stages(const Options& o, std::vector<StageRun>& runs, int ranks, std::int64_t global_batch,
                  metrics::MetricsWriter& metrics);
// --save: rank 0 writes the gathered parameters under `model`'s names and shapes. Collective-free.
void save_gathered(const Options& o, const StageRun& run, const nn::Module& model, comm::Communicator& group);
void print_memory_table(const std::vector<StageRun>& runs, int ranks, const std::string& network);
// The lock-step verdict of one stage's run, in one line; true when it passed.
bool report_check(const StageRun& run);
// --consolidate STEP_DIR --save FILE: the shards of a checkpoint as one ordinary safetensors file.
int consolidate(const Options& o);
// --compare: how to draw the stages' charts from the metrics (scripts/plot.py zero).
void suggest_charts(const Options& o);

}  // namespace course::chapter07
