// What chapter 05 prints and records for each way of synchronising: the table row (step time split
// into compute and exposed communication, messages, bytes, the lock-step verdict), its metrics, and the
// timeline of the last overlapped step as Chrome trace JSON.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "05_bucketing_overlap/options.h"
#include "common/comm/communicator.h"
#include "common/core/device.h"
#include "common/metrics/metrics.h"
#include "common/nn/module.h"
#include "common/parallel/reducer.h"
#include "common/verify/lockstep.h"

namespace course::chapter05 {

struct ModeResult {
  double step_ms = 0, exposed_ms = 0;  // per step, mean over the timed steps
  std::size_t messages = 0;            // all-reduces per step: one per gradient (04), or per bucket
  std::int64_t bytes_per_step = 0;
  std::vector<float> parameters;
  std::shared_ptr<nn::Module> model;  // the trained model (--save writes the overlapped mode's)
  verify::LockstepSummary check;
  parallel::Timeline timeline;  // the last step (overlap mode)
};

void print_table_header();
// The mode's row and its "mode" metric; `first` is the first mode's final parameters (free-running, the
// modes differ from it only by summation order); with --predict, the cost model's price of the same
// mode beside it. Returns whether the mode passed its check.
bool report_mode(const Options& o, const std::string& name, const ModeResult& r, const std::vector<float>& first,
                 int ranks, std::int64_t global_batch, const std::string& label, metrics::MetricsWriter& metrics);
// Why overlap gained little on this run, in the words true of where it ran: on the CPU a rank's copy
// takes the cores backward runs on; on a GPU shared by MPI ranks each bucket is staged through the host
// on the stream backward computes on; on NCCL (a GPU per rank) the buckets had their own stream.
std::string why_overlap_gains_little(Device device, const std::string& backend, const std::string& label);
// Every rank's timeline of the last overlapped step, gathered to rank 0 and written to --trace. Collective.
void write_trace(const Options& o, comm::Communicator& group, const parallel::Timeline& mine, const std::string& label);

}  // namespace course::chapter05
