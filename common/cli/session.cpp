// Chapter set-up, with errors translated into the flags they came from.
#include "common/cli/session.h"

#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "common/comm/agree.h"
#include "common/comm/environment.h"
#include "common/core/cpu_cores.h"
#include "common/core/log.h"

namespace course::cli {
namespace {

// Runs `step`, prefixing a UsageError's message with the flag it concerns.
template <class F>
auto naming(const std::string& flag, F&& step) {
  try {
    return step();
  } catch (const UsageError& e) {
    throw UsageError(flag + ": " + e.what());
  }
}

// What the CPU kernels run on (rank 0 logs; its metrics record it): a rank's threads and the cores it may use.
void report_cpu_cores(metrics::MetricsWriter& metrics) {
  const CpuCores cores = cpu_cores();
  log("cpu: %s\n", describe(cores).c_str());
  metrics.write_before_first({{"event", "cpu_cores"}, {"threads", cores.threads}, {"cores_allowed", cores.allowed},
                 {"cores_bound", cores.bound}, {"cores", cores.machine}, {"why", cores.why}});
}

}  // namespace

void fail_here_if_asked(const char* phase, std::int64_t step, int rank) {
  const char* spec = std::getenv("COURSE_FAIL");
  if (!spec) return;
  const std::string wanted = std::string(phase) + ":" + std::to_string(step) + ":" + std::to_string(rank);
  if (wanted == spec)
    throw std::runtime_error("injected failure (COURSE_FAIL=" + wanted + ") on rank " + std::to_string(rank));
}

Session start_session(const CommonOptions& common) {
  // A single-process chapter, alone on its machine unless a launcher started several (Open MPI says how many).
  const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
  configure_cpu_threads(local && std::atoi(local) > 1 ? std::atoi(local) : 1);
  Session s;
  s.device = naming("--device " + common.device, [&] { return select_device(common.device); });
  s.metrics = naming("--metrics", [&] { return metrics::MetricsWriter(common.metrics); });
  report_cpu_cores(s.metrics);
  return s;
}

Session start_session(const CommonOptions& common, const DistributedOptions& distributed, parallel::GridShape shape) {
  if (distributed.timeout < 1e-3) {
    char text[32];
    std::snprintf(text, sizeof text, "%g", distributed.timeout);
    throw UsageError(std::string("--timeout: ") + text + " s is less than a millisecond, the watchdog's resolution");
  }
  if (distributed.timeout > comm::kMaxTimeoutSeconds)
    throw UsageError("--timeout: " + std::to_string(distributed.timeout) + " is more than a week (" +
                     std::to_string(static_cast<long>(comm::kMaxTimeoutSeconds)) + " s)");
  comm::Communicator::consistency_checks();  // COURSE_CHECK_COLLECTIVES read (and refused if bad) before any collective
  const comm::Placement placement = comm::world_placement();
  Session s;
  // These depend only on the flags and the machine, so every rank fails alike and rank 0 says why.
  s.device = naming("--device " + common.device,
                    [&] { return select_device(common.device, placement.local_rank, placement.rank == 0); });
  configure_cpu_threads(placement.local_size);
  auto world = naming("--backend " + distributed.backend,
                      [&] { return comm::make_world(distributed.backend, s.device, distributed.timeout); });
  s.topology = naming(shape.cp > 1 ? "--tp/--cp/--pp/--dp" : "--tp/--pp/--dp",
                      [&] { return std::make_unique<parallel::Topology>(std::move(world), shape); });
  fail_here_if_asked("setup", 0, placement.rank);
  // Only rank 0 opens the metrics file, so this can fail on one rank alone: the ranks agree on the
  // outcome before anything else is communicated, and the first rank that failed reports.
  std::string error;
  try {
    if (placement.rank == 0) s.metrics = naming("--metrics", [&] { return metrics::MetricsWriter(common.metrics); });
  } catch (const UsageError& e) {
    error = e.what();
  }
  const comm::FirstError first = comm::first_error(s.topology->world(), error);
  if (first.any()) {
    if (placement.rank == first.rank) std::fprintf(stderr, "error: %s\n", error.c_str());
    throw ReportedError{2};
  }
  report_cpu_cores(s.metrics);
  return s;
}

}  // namespace course::cli
