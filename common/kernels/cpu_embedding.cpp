// The embedding's lookup on the CPU and its gradient, each row added in increasing position.
#include <algorithm>

#include "common/kernels/cpu_kernels.h"

namespace course {
using namespace cpu_loops;

void CpuKernels::embedding(const float* ids, const float* weight, std::size_t n, std::size_t dim, std::size_t, float* out) {
  parallel_for(n, dim, [&](std::size_t first, std::size_t end) {
    for (std::size_t i = first; i < end; ++i)
      std::copy_n(weight + static_cast<std::size_t>(ids[i]) * dim, dim, out + i * dim);
  });
}

void CpuKernels::embedding_backward(const float* ids, const float* g, std::size_t n, std::size_t dim, std::size_t vocab,
                        float* dw) {
  fill(dw, vocab * dim, 0.0f);
  // The threads take blocks of the dimension, every one walking the ids in order: no two write the
  // same element, and each element adds its rows in increasing i, at any thread count.
  parallel_for(dim, n, [&](std::size_t first, std::size_t end) {
    for (std::size_t i = 0; i < n; ++i) {
      float* row = dw + static_cast<std::size_t>(ids[i]) * dim;
      for (std::size_t d = first; d < end; ++d) row[d] += g[i * dim + d];
    }
  });
}

}  // namespace course
