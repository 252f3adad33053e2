// The embedding's gradient on the GPU, in parallel and in the CPU's order: the CUDA backend's
// Kernels::embedding_backward.
#pragma once
#include <cstddef>

namespace course::cuda_embedding {

// grad_weight (vocab x dim, overwritten) row v = the sum of grad_out rows i with ids[i] = v, added in
// increasing i from zero, as the CPU adds them (kernels.h); ids that are not valid indices add nothing.
void backward(const float* ids, const float* grad_out, std::size_t n, std::size_t dim, std::size_t vocab,
              float* grad_weight);

}  // namespace course::cuda_embedding
