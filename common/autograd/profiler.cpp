// The op profiler: a thread-local active Profile and a depth counter, so nested scopes count once.
#include "common/autograd/profiler.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "common/core/cuda_runtime.h"
#include "common/tensor/tensor.h"  // count_synchronization

namespace course::autograd::profiler {
namespace {

thread_local Profile* t_profile = nullptr;
thread_local int t_depth = 0;  // open scopes on this thread

std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void synchronize(Device device) {
  count_synchronization();
#if COURSE_HAVE_CUDA
  if (device == Device::cuda) cuda::synchronize();
#else
  (void)device;
#endif
}

}  // namespace

Profile::Profile(Device device) : device_(device), previous_(t_profile) { t_profile = this; }
Profile::~Profile() { t_profile = previous_; }

void Profile::reset() { ops_.clear(); }

std::vector<OpTime> Profile::table() const {
  std::vector<OpTime> sorted = ops_;
  std::stable_sort(sorted.begin(), sorted.end(), [](const OpTime& a, const OpTime& b) {
    return a.forward_ms + a.backward_ms > b.forward_ms + b.backward_ms;
  });
  return sorted;
}

RecordFunction::RecordFunction(const char* name, bool backward) {
  if (!t_profile || t_depth++ > 0) return;  // off, or inside another op's scope
  name_ = name;
  backward_ = backward;
  synchronize(t_profile->device());
  start_ns_ = now_ns();
}

RecordFunction::~RecordFunction() {
  if (!t_profile) return;
  --t_depth;
  if (name_) finish();
}

void RecordFunction::finish() {
  synchronize(t_profile->device());
  const double ms = static_cast<double>(now_ns() - start_ns_) * 1e-6;
  auto& ops = t_profile->ops_;
  auto it = std::find_if(ops.begin(), ops.end(), [&](const OpTime& op) { return op.name == name_; });
  if (it == ops.end()) it = ops.insert(ops.end(), OpTime{name_});
  (backward_ ? it->backward_ms : it->forward_ms) += ms;
  ++(backward_ ? it->backward_calls : it->forward_calls);
}

}  // namespace course::autograd::profiler
