// This machine as the planner's cluster, measured rather than assumed (the DGX presets' figures come
// from datasheets, cluster.cpp). What a small GPT's layer costs on a CPU is mostly not its arithmetic at
// the memory's speed, as on a GPU, but each op's fixed cost and the element-wise ops' own arithmetic
// (GELU's tanh), so the calibration times the ops themselves, forward and backward, each on one thread
// and on every core: the linear layer over a range of sizes (its curve: a fixed part, then the rate of
// the largest), the layer's element-wise ops (two layer norms, GELU over 4h, two residual additions) at
// three token counts (a fixed part and a cost per token-channel), attention per sequence-head pair, and
// an addition on a few elements (an op's fixed cost alone, for the ops outside the layers); the memory's
// bandwidth (a copy of 64 MiB); and the link between two ranks, chapter 03's alpha-beta fit of its
// ping-pong (03_collectives --metrics FILE writes it; fitted with as many ranks on the machine as the run
// has, it carries what sharing the cores costs a message). A "GPU" of this cluster is one rank: ranks
// that share the machine run one thread each (as the chapters set them, cli::configure_cpu_threads), and
// more ranks than cores share the cores evenly.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/planner/cluster.h"

namespace course::planner {

// A GEMM of F FLOPs takes F0 / rate + F / rate: its fixed part, then the rate its largest sizes reach.
struct GemmCurve {
  double flops_per_second = 0;  // the rate of the largest GEMMs
  double half_rate_flops = 0;   // F0: a GEMM of F0 FLOPs runs at half that rate
};

// What one rank's threads do at one thread count.
struct OpRates {
  GemmCurve linear;                      // a linear layer forward and backward: 6 m k n FLOPs
  double elementwise_fixed_seconds = 0;  // a layer's element-wise ops, forward and backward: fixed part
  double elementwise_seconds_per_element = 0;  // and per token-channel
  double attention_seconds_per_head = 0;  // causal attention per sequence-head pair, at the widths measured
  double bandwidth = 0;                  // bytes per second, read plus written
};

struct Calibration {
  int cores = 1;
  OpRates one_thread, all_cores;
  double op_seconds = 0;     // one small op's forward and backward: its fixed cost alone
  double memory_bytes = 0;   // the machine's
  Link link;                 // between two ranks (chapter 03's fit)
};

// Times this machine's GEMMs, memory and ops (a few seconds); `link` is chapter 03's fit.
Calibration measure_this_machine(const Link& link);

// The fit of `seconds[i]` = a + b x[i], least squares on the relative error (the sizes span orders of
// magnitude), a kept at 0 or more. As a GEMM curve: rate 1 / b, F0 a / b. Exposed for its test.
std::pair<double, double> fit_line(const std::vector<double>& x, const std::vector<double>& seconds);
GemmCurve fit_gemm_curve(const std::vector<double>& flops, const std::vector<double>& seconds);

nlohmann::json to_json(const Calibration& c);
// Throws std::invalid_argument naming the first field that is missing or not a positive number.
Calibration calibration_from_json(const nlohmann::json& j);

// The calibration in FILE (benchmarks/plan --calibrate's); throws std::invalid_argument saying what is
// wrong with it, the file named.
Calibration read_calibration(const std::string& path);

// `ranks` ranks of the course on this machine: one node of `ranks` devices, each with the rate its
// threads get (above; a rank alone `threads_alone` threads: one under mpirun, which binds a job of one or
// two ranks to a core each), the link between any two the calibration's.
Cluster this_machine(const Calibration& c, int ranks, int threads_alone = 1);

}  // namespace course::planner
