// The Reducer: DDP's gradient synchronisation in buckets (Li et al., "PyTorch Distributed:
// Experiences on Accelerating Data Parallel Training", VLDB 2020, sections 3.2-3.3).
//
// Parameters are packed into buckets of at most bucket_cap_mb, in reverse registration order, since
// backward produces the last layer's gradients first; the first bucket is smaller (first_bucket_mb)
// so that communication starts early. Each bucket owns one flat buffer and the parameters' gradients
// are views into it (PyTorch's gradient_as_bucket_view): backward accumulates straight into the
// buffer and nothing is copied. When every gradient of a bucket is ready, the bucket's asynchronous
// all-reduce is launched while backward goes on computing earlier layers (overlap). Buckets launch
// in bucket order on every rank, so all ranks agree which collective comes next. After the first
// step the buckets are rebuilt once, in the order gradients actually became ready (rank 0's order,
// broadcast), as PyTorch does.
//
//                 backward:  layer 8 | layer 7 | layer 6 | ... | layer 1 |
//   communication (overlap):           [bucket 0]  [ bucket 1 ] ...        [bucket k]   <- exposed
#pragma once
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/comm/communicator.h"
#include "common/core/dtype.h"
#include "common/nn/module.h"
#include "common/parallel/comm_hooks.h"

namespace course::parallel {

// Which parameters share a bucket (PyTorch's _compute_bucket_assignment_by_size). `order`: the
// parameters' indices in the order their gradients are expected (reverse registration at first, the
// observed order after the rebuild); `bytes[i]`: parameter i's gradient size. The parameters are taken in
// that order; one that would take a non-empty bucket past its cap starts the next bucket. The first
// bucket's cap is `first_cap`, every later one's `cap` (bytes). Returns the buckets, each its parameters.
using BucketAssignment = std::function<std::vector<std::vector<std::size_t>>(
    const std::vector<std::size_t>& order, const std::vector<std::size_t>& bytes, std::size_t first_cap, std::size_t cap)>;
std::vector<std::vector<std::size_t>> assign_buckets_by_size(const std::vector<std::size_t>& order,
                                                             const std::vector<std::size_t>& bytes,
                                                             std::size_t first_cap, std::size_t cap);

struct ReducerOptions {
  double bucket_cap_mb = 25;           // PyTorch's default
  double first_bucket_mb = 1;          // PyTorch's default: the first bucket starts communication early
  bool overlap = true;                 // launch each bucket as soon as it is complete
  bool find_unused_parameters = false; // a parameter without a gradient counts as zero instead of an error
  bool rebuild_buckets = true;         // after the first step, rebuild in the observed gradient order
  bool record_timeline = false;        // record when each gradient and bucket finished (for the trace)
  // The type gradients are averaged in (FSDP's MixedPrecision.reduce_dtype): float32, or bfloat16 or
  // float16 for half the bytes, each bucket divided by the world size, rounded, summed in that type and
  // widened back (comm_hooks.h: average_hook). A registered hook replaces it.
  DType reduce_dtype = DType::float32;
  // Another assignment of the same contract (chapter 05's own, its exercise); empty: assign_buckets_by_size.
  // Whatever it returns is checked: every parameter in exactly one bucket, no bucket empty.
  BucketAssignment assign_buckets;
};

struct Bucket {
  std::vector<std::size_t> parameters;  // indices into the parameter list, in bucket order
  std::vector<std::size_t> offsets;     // each parameter's first element in the buffer
  Tensor buffer;                        // the gradients, laid end to end
  std::size_t pending = 0;              // gradients not yet ready in this backward pass
  comm::WorkHandle work;                // the bucket's communication in flight
};

// Timestamps of one backward pass, in milliseconds since the pass's first gradient.
struct Timeline {
  struct Interval {
    std::string name;
    double begin_ms, end_ms;
  };
  std::vector<Interval> compute;        // backward between consecutive gradient-ready events
  std::vector<Interval> communication;  // each bucket, from launch to completion
  double backward_end_ms = 0, synchronised_ms = 0;
};

class Reducer {
 public:
  Reducer(std::vector<nn::NamedTensor> parameters, comm::Communicator& group, ReducerOptions options = {});

  void mark_ready(std::size_t index, bool sync);  // from the post-accumulate hook; sync: not inside no_sync
  // At the end of backward: launch what is left, wait for everything, leave the averages in .grad.
  // With sync off (no_sync), gradients only accumulate.
  void finalize(bool sync);
  void register_comm_hook(CommHook hook) { hook_ = std::move(hook); }

  const std::vector<Bucket>& buckets() const { return buckets_; }
  const ReducerOptions& options() const { return options_; }
  bool rebuilt() const { return rebuilt_; }
  std::int64_t bytes_communicated() const { return bytes_; }  // since construction, per rank
  const Timeline& last_timeline() const { return timeline_; }
  // Wall time from the end of backward's compute to the last bucket's completion, last pass (ms):
  // the communication that overlap did not hide.
  double exposed_ms() const { return exposed_ms_; }

 private:
  void build(const std::vector<std::size_t>& order);
  void launch_ready_buckets(bool all);
  void poll(double now_ms);
  double now_ms() const;

  std::vector<nn::NamedTensor> parameters_;
  comm::Communicator& group_;
  ReducerOptions options_;
  CommHook hook_;
  std::vector<Bucket> buckets_;
  std::vector<std::size_t> bucket_of_;  // parameter -> bucket
  std::vector<bool> ready_;
  std::vector<std::size_t> ready_order_;  // this pass, for the rebuild
  std::size_t next_launch_ = 0;
  bool rebuilt_ = false, first_sync_done_ = false;
  std::int64_t bytes_ = 0;
  std::chrono::steady_clock::time_point pass_start_;
  bool pass_started_ = false;
  double last_ready_ms_ = 0, exposed_ms_ = 0;
  std::vector<double> launched_ms_, completed_ms_;
  Timeline timeline_;
};

}  // namespace course::parallel
