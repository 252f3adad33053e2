// The embedding's lookup on the GPU; its gradient is CUB's stable sort by id (cuda_embedding_backward.cu).
#include "common/kernels/cuda_embedding_backward.h"

#include "common/kernels/cuda_kernels.h"

namespace course {
using namespace cuda_launch;
namespace {

__global__ void embedding_kernel(const float* ids, const float* weight, std::size_t n, std::size_t dim,
                                 std::size_t vocab, float* out) {
  for (std::size_t k = blockIdx.x * blockDim.x + threadIdx.x; k < n * dim; k += gridDim.x * blockDim.x) {
    const std::size_t i = k / dim, d = k % dim;
    out[k] = math::valid_index(ids[i], vocab, NAN) ? weight[static_cast<std::size_t>(ids[i]) * dim + d] : 0.0f;
  }
}

}  // namespace

void CudaKernels::embedding(const float* ids, const float* weight, std::size_t n, std::size_t dim, std::size_t vocab,
               float* out) {
  if (!n || !dim) return;
  embedding_kernel<<<blocks_for(n * dim), kThreads>>>(ids, weight, n, dim, vocab, out);
  check_launch();
}

void CudaKernels::embedding_backward(const float* ids, const float* g, std::size_t n, std::size_t dim, std::size_t vocab,
                        float* dw) {
  cuda_embedding::backward(ids, g, n, dim, vocab, dw);
}

}  // namespace course
