// The optimizers' updates on the GPU: SGD a thread per element, AdamW over a list of tensors in one
// launch (multi-tensor apply, multi_tensor.h), each math.h's formula.
#include <algorithm>
#include <vector>

#include "common/kernels/cuda_kernels.h"
#include "common/kernels/multi_tensor.h"

namespace course {
using namespace cuda_launch;
namespace {

// One thread per column d walks the positions in order, so each sum is added in increasing i, as on
// the CPU, with no atomics: deterministic.
__global__ void sgd_kernel(float* p, const float* g, float* buf, std::size_t n, SgdParams s) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
  {
    float none = 0.0f;  // without momentum there is no buffer
    p[i] = math::sgd_update(p[i], g[i], buf ? buf[i] : none, s.lr, s.momentum, s.weight_decay);
  }
}

// Up to kMultiTensorLaunch tensors in the kernel's parameters (__grid_constant__: read where they lie, a
// tensor picked at run time without copying the table to each thread).
struct AdamLaunch {
  AdamTensor tensors[math::kMultiTensorLaunch];
  math::MultiTensorChunks chunks;
};

__global__ void adam_kernel(const __grid_constant__ AdamLaunch list, AdamParams a) {
  for (std::size_t chunk = blockIdx.x; chunk < list.chunks.first[list.chunks.count]; chunk += gridDim.x) {
    const math::ChunkRange r = math::multi_tensor_range(list.chunks, list.tensors, chunk);
    const AdamTensor& x = list.tensors[r.tensor];
    for (std::size_t i = r.begin + threadIdx.x; i < r.end; i += blockDim.x) {
      x.param[i] = math::adam_update(x.param[i], x.grad[i], x.m[i], x.v[i], a.lr, a.beta1, a.beta2, a.eps,
                                     x.weight_decay, a.decoupled_weight_decay, a.bias_correction1,
                                     a.bias_correction2);
      if (a.zero_grad) x.grad[i] = 0.0f;
    }
  }
}

}  // namespace

void CudaKernels::sgd_step(float* p, const float* g, float* buf, std::size_t n, const SgdParams& s) {
  if (!n) return;
  sgd_kernel<<<blocks_for(n), kThreads>>>(p, g, buf, n, s);
  check_launch();
}

void CudaKernels::adam_step(const std::vector<AdamTensor>& list, const AdamParams& a) {
  math::for_each_multi_tensor_launch(list, [&](const AdamTensor* tensors, int count, const math::MultiTensorChunks& chunks) {
    const std::size_t total = chunks.first[count];
    if (!total) return;
    AdamLaunch launch;
    std::copy(tensors, tensors + count, launch.tensors);
    launch.chunks = chunks;
    adam_kernel<<<static_cast<unsigned>(std::min<std::size_t>(total, 1u << 20)), kThreads>>>(launch, a);
    check_launch();
  });
}

}  // namespace course
