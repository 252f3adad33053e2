// Device selection; the CUDA queries live in cuda_runtime.cu so this file builds without CUDA.
#include "common/core/device.h"

#include <cstdio>

#include "common/core/cuda_runtime.h"

namespace course {

const char* device_name(Device device) { return device == Device::cuda ? "cuda" : "cpu"; }

int cuda_device_count() {
#if COURSE_HAVE_CUDA
  return cuda::device_count(nullptr);
#else
  return 0;
#endif
}

bool cuda_usable(std::string* reason) {
#if COURSE_HAVE_CUDA
  std::string why;
  int count = cuda::device_count(&why);
  if (count > 0) return true;
  if (reason) *reason = why.empty() ? "no CUDA device found" : why;
  return false;
#else
  if (reason) *reason = std::string("this build has no CUDA backend (") + COURSE_NO_CUDA_REASON + ")";
  return false;
#endif
}

Device select_device(const std::string& choice, int local_rank, bool announce) {
  if (choice != "auto" && choice != "cpu" && choice != "cuda")
    throw UsageError("unknown device '" + choice + "' (expected auto, cpu or cuda)");
  if (choice == "cpu") return Device::cpu;
  std::string reason;
  if (!cuda_usable(&reason)) {
    if (choice == "cuda") throw UsageError("no usable GPU: " + reason);
    if (announce) std::printf("No usable GPU (%s); running on the CPU.\n", reason.c_str());
    return Device::cpu;
  }
#if COURSE_HAVE_CUDA
  cuda::set_device(local_rank % cuda_device_count());
#else
  (void)local_rank;
#endif
  return Device::cuda;
}

}  // namespace course
