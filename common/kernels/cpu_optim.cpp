// The optimizers' updates on the CPU: SGD, and AdamW over a list of tensors in the GPU's chunks
// (multi_tensor.h), each with math.h's formula.
#include <algorithm>
#include <vector>

#include "common/kernels/cpu_kernels.h"
#include "common/kernels/cpu_vector.h"
#include "common/kernels/multi_tensor.h"

namespace course {
using namespace cpu_loops;

namespace {
// math::adam_update over one span, in a loop the compiler vectorises (8 lanes with AVX2): the four arrays
// never overlap (restrict), the hyperparameters are locals (no store can change them), and the decay's
// kind is decided once, outside the loop. Each element's operations are math.h's, in its order, with no
// contraction (CMakeLists.txt): the same bits as one element at a time.
template <bool Decoupled>
inline __attribute__((always_inline)) void adam_span(float* __restrict p, float* __restrict g, float* __restrict m, float* __restrict v, std::size_t n,
               float lr, float b1, float b2, float eps, float wd, float bc1, float bc2) {
  for (std::size_t i = 0; i < n; ++i) p[i] = math::adam_update(p[i], g[i], m[i], v[i], lr, b1, b2, eps, wd, Decoupled, bc1, bc2);
}
COURSE_CPU_CLONES void adam_elements(float* p, float* g, float* m, float* v, std::size_t n, const AdamParams& a, float wd) {
  if (a.decoupled_weight_decay)
    adam_span<true>(p, g, m, v, n, a.lr, a.beta1, a.beta2, a.eps, wd, a.bias_correction1, a.bias_correction2);
  else
    adam_span<false>(p, g, m, v, n, a.lr, a.beta1, a.beta2, a.eps, wd, a.bias_correction1, a.bias_correction2);
}
}  // namespace

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
        adam_elements(x.param + r.begin, x.grad + r.begin, x.m + r.begin, x.v + r.begin, r.end - r.begin, a,
                      x.weight_decay);
        if (a.zero_grad) std::fill(x.grad + r.begin, x.grad + r.end, 0.0f);
      }
    });
  });
}

}  // namespace course
