// Where a training step's time goes, op by op: the idea of torch.autograd.profiler.profile. While a
// Profile is alive on a thread, every primitive op that thread runs is timed under its name, forward and
// backward apart (the engine times each node's backward rule); an op called inside another's scope (the
// matmuls inside matmul's backward) counts for the outer one only, so the times add up. On the GPU each
// scope synchronises the device first and last, so it measures the kernels, not their launches.
// Off, a scope costs one thread-local read.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "common/core/device.h"

namespace course::autograd::profiler {

struct OpTime {
  std::string name;
  double forward_ms = 0, backward_ms = 0;
  std::int64_t forward_calls = 0, backward_calls = 0;
};

class Profile {
 public:
  explicit Profile(Device device);
  ~Profile();
  Profile(const Profile&) = delete;
  Profile& operator=(const Profile&) = delete;
  // Every op seen, the most expensive (forward + backward) first.
  std::vector<OpTime> table() const;
  void reset();  // forget what was timed so far (after warm-up steps)
  Device device() const { return device_; }

 private:
  friend class RecordFunction;
  Device device_;
  std::vector<OpTime> ops_;
  Profile* previous_;
};

// Times the enclosing scope as op `name` in the thread's Profile, if one is alive and no other scope
// is open on this thread. `name` must outlive the scope (the ops pass literals).
class RecordFunction {
 public:
  explicit RecordFunction(const char* name, bool backward = false);
  ~RecordFunction();
  RecordFunction(const RecordFunction&) = delete;
  RecordFunction& operator=(const RecordFunction&) = delete;

 private:
  void finish();
  const char* name_ = nullptr;
  bool backward_ = false;
  std::int64_t start_ns_ = 0;
};

}  // namespace course::autograd::profiler
