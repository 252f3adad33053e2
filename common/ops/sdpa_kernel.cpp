// The attention backend's scope (sdpa_kernel.h): one optional choice per thread, restored on exit.
#include "common/ops/sdpa_kernel.h"

#include <stdexcept>
#include <string>

#include "common/kernels/flash.h"

namespace course {
namespace {

thread_local std::optional<SdpBackend> t_backend;

}  // namespace

SdpaKernel::SdpaKernel(SdpBackend backend) : previous_(t_backend) { t_backend = backend; }
SdpaKernel::~SdpaKernel() { t_backend = previous_; }

SdpBackend sdp_backend(Device device, std::int64_t head_size) {
  const bool fits = head_size <= math::kFlashMaxHeadSize;
  if (t_backend) {
    if (*t_backend == SdpBackend::flash_attention && !fits)
      throw std::invalid_argument("scaled_dot_product_attention: FlashAttention takes head sizes up to " +
                                  std::to_string(math::kFlashMaxHeadSize) + ", got " + std::to_string(head_size));
    return *t_backend;
  }
  return device == Device::cuda && fits ? SdpBackend::flash_attention : SdpBackend::math;
}

}  // namespace course
