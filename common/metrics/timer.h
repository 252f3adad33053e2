// Timers: CUDA events on the GPU (they time the device's work, not the launch), a steady clock on the CPU.
#pragma once
#include <chrono>

#include "common/core/device.h"

namespace course::metrics {

class Timer {
 public:
  explicit Timer(Device device = Device::cpu);
  ~Timer();
  Timer(const Timer&) = delete;
  Timer& operator=(const Timer&) = delete;
  void start();
  double stop_ms();  // waits for the device's work, then returns the time since start()

 private:
  Device device_;
  std::chrono::steady_clock::time_point begin_;
  void* events_[2] = {nullptr, nullptr};
};

}  // namespace course::metrics
