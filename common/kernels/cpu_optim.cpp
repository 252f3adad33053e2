// The optimizers' updates on the CPU: SGD, and AdamW over a list of tensors in the GPU's chunks
// (multi_tensor.h), each with math.h's formula.
#include <algorithm>
#include <vector>

#include "common/kernels/cpu_kernels.h"
#include "common/kernels/multi_tensor.h"

namespace course {
using namespace cpu_loops;

void CpuKernels::sgd_step(float* p, const float* g, float* buf, std::size_t n, const SgdParams& s) {
  if (buf) {
    elementwise(n, [&](std::size_t i) { p[i] = math::sgd_update(p[i], g[i], buf[i], s.lr, s.momentum, s.weight_decay); });
  } else {  // without momentum there is no buffer: buf = 0 * buf + g
    elementwise(n, [&](std::size_t i) {
      float none = 0.0f;
      p[i] = math::sgd_update(p[i], g[i], none, s.lr, s.momentum, s.weight_decay);
    });
  }
}

// The GPU's chunks (multi_tensor.h), each chunk's elements in order.
void CpuKernels::adam_step(const std::vector<AdamTensor>& list, const AdamParams& a) {
  math::for_each_multi_tensor_launch(list, [&](const AdamTensor* tensors, int, const math::MultiTensorChunks& chunks) {
    parallel_for(chunks.first[chunks.count], 1, [&](std::size_t first, std::size_t last) {
      for (std::size_t chunk = first; chunk < last; ++chunk) {
        const math::ChunkRange r = math::multi_tensor_range(chunks, tensors, chunk);
        const AdamTensor& x = tensors[r.tensor];
        for (std::size_t i = r.begin; i < r.end; ++i)
          x.param[i] = math::adam_update(x.param[i], x.grad[i], x.m[i], x.v[i], a.lr, a.beta1, a.beta2, a.eps,
                                         x.weight_decay, a.decoupled_weight_decay, a.bias_correction1,
                                         a.bias_correction2);
        if (a.zero_grad) std::fill(x.grad + r.begin, x.grad + r.end, 0.0f);
      }
    });
  });
}

}  // namespace course
