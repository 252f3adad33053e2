// Which kernel scaled_dot_product_attention runs, chosen as torch.nn.attention.sdpa_kernel chooses among
// PyTorch's SDPBackend: FlashAttention (Dao, 2023), which keeps each row's log-sum-exp and computes the
// probabilities again in backward, or the math kernel, which keeps the [B, H, T, T] probabilities.
//
//   {
//     SdpaKernel flash(SdpBackend::flash_attention);  // with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
//     y = scaled_dot_product_attention(qkv, n_head);   //   every call in the scope runs FlashAttention
//   }
//
// Without a scope: FlashAttention on a GPU, for head sizes up to math::kFlashMaxHeadSize; the math kernel
// on the CPU (its GEMMs vectorise; the CPU's FlashAttention is the GPU kernels' model, kept for the tests)
// and for larger heads. Ours differs from PyTorch's in taking one backend, not a list of them.
#pragma once
#include <cstdint>
#include <optional>

#include "common/core/device.h"

namespace course {

enum class SdpBackend { math, flash_attention };

// While one is alive on this thread, scaled_dot_product_attention runs `backend`. Scopes nest.
class SdpaKernel {
 public:
  explicit SdpaKernel(SdpBackend backend);
  ~SdpaKernel();
  SdpaKernel(const SdpaKernel&) = delete;
  SdpaKernel& operator=(const SdpaKernel&) = delete;

 private:
  std::optional<SdpBackend> previous_;
};

// The backend a call on `device` with heads of `head_size` runs: the innermost scope's, or the default
// above. FlashAttention chosen for a head larger than it takes throws std::invalid_argument.
SdpBackend sdp_backend(Device device, std::int64_t head_size);

}  // namespace course
