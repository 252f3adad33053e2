// Timer implementation; the CUDA event calls are in core/cuda_runtime.cu.
#include "common/metrics/timer.h"

#include "common/core/cuda_runtime.h"

namespace course::metrics {

Timer::Timer(Device device) : device_(device) {
#if COURSE_HAVE_CUDA
  if (device_ == Device::cuda) {
    events_[0] = cuda::event_create();
    events_[1] = cuda::event_create();
  }
#endif
}

Timer::~Timer() {
#if COURSE_HAVE_CUDA
  for (void* e : events_) cuda::event_destroy(e);
#endif
}

void Timer::start() {
#if COURSE_HAVE_CUDA
  if (device_ == Device::cuda) {
    cuda::event_record(events_[0]);
    return;
  }
#endif
  begin_ = std::chrono::steady_clock::now();
}

double Timer::stop_ms() {
#if COURSE_HAVE_CUDA
  if (device_ == Device::cuda) {
    cuda::event_record(events_[1]);
    return cuda::event_elapsed_ms(events_[0], events_[1]);
  }
#endif
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - begin_).count();
}

}  // namespace course::metrics
