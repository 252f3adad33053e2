// What every chapter does before its lesson, written once: pick the device, build the topology
// (chapters run under mpirun), open the metrics file, set the CPU threads. Errors name their flags,
// and a set-up error on any rank ends every rank with it, never leaving the others waiting in a
// collective.
#pragma once
#include <cstdint>
#include <memory>

#include "common/cli/cli.h"
#include "common/core/device.h"
#include "common/metrics/metrics.h"
#include "common/parallel/topology.h"

namespace course::cli {

struct Session {
  Device device = Device::cpu;
  std::unique_ptr<parallel::Topology> topology;  // multi-rank chapters only
  metrics::MetricsWriter metrics;                 // written by rank 0 alone
};

// A one-process chapter (01, 02).
Session start_session(const CommonOptions& common);

// A chapter under mpirun: the world as a TP x PP x DP grid of `shape` (pure data parallelism by default).
Session start_session(const CommonOptions& common, const DistributedOptions& distributed,
                      parallel::GridShape shape = {});

// Fault injection, to watch (and test) how a job ends when one rank fails: with the environment
// variable COURSE_FAIL=PHASE:STEP:RANK, that rank throws std::runtime_error when it reaches PHASE
// ("setup" or "train") at STEP (0 for setup). Every other rank must then be ended within seconds.
void fail_here_if_asked(const char* phase, std::int64_t step, int rank);

}  // namespace course::cli
