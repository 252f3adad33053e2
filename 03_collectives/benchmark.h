// The chapter's benchmark harness, in the layout of nccl-tests: each collective declares its byte
// count, its inputs, its closed-form answer and its bus-bandwidth factor; the harness times and checks.
#pragma once
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "common/comm/communicator.h"
#include "common/metrics/metrics.h"

namespace course::chapter03 {

struct BenchOptions {
  std::size_t min_bytes = 8, max_bytes = 4 << 20, factor = 8;
  int warmup = 2, iters = 5;
  int root = 0;
  std::set<std::string> ops;  // which collectives to run; empty means all
};
extern const std::set<std::string> kBenchmarkOps;  // all_reduce, broadcast, reduce, all_gather, reduce_scatter

// Latency alpha (s) and inverse bandwidth beta (s/byte), fitted to timed point-to-point transfers.
struct AlphaBeta {
  double alpha = 0, beta = 0;
  bool valid = false;
};
AlphaBeta fit_alpha_beta(comm::Communicator& comm, const BenchOptions& o, metrics::MetricsWriter& out);

// On a GPU: the device's copy bandwidth (bytes read + written per second) at the largest size, the
// ceiling that a collective on one GPU's memory can approach. On the CPU: one core's memcpy (bytes
// copied per second), the rate a collective through the machine's memory is held against.
void report_device_bandwidth(comm::Communicator& c, const BenchOptions& o, Device device, metrics::MetricsWriter& out);

// Runs every collective and algorithm over the sizes; prints the table; returns the number of wrong elements.
long run_benchmarks(comm::Communicator& comm, const BenchOptions& o, const AlphaBeta& model, Device device,
                    metrics::MetricsWriter& out);

}  // namespace course::chapter03
