// CUDA kernels, the same interface as the CPU's (cuda_kernels.h lists where each family lives): here the
// fills, copies, dropout and index checks, and the backend's one instance.

#include "common/kernels/cuda_kernels.h"
#include "common/tensor/random.h"

namespace course {
using namespace cuda_launch;
namespace {

__global__ void fill_kernel(float* out, std::size_t n, float value) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) out[i] = value;
}

__global__ void fill_bits_kernel(std::uint16_t* out, std::size_t n, std::uint16_t bits) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) out[i] = bits;
}

__global__ void arange_kernel(float* out, std::size_t n) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    out[i] = static_cast<float>(i);
}

__global__ void dropout_kernel(const float* in, float* out, std::size_t n, float p, std::uint64_t seed,
                               std::uint64_t first) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    out[i] = rn::mul(in[i], math::dropout_keep(seed, first + i, p));
}

__global__ void check_indices_kernel(IndexCheck check, const float* ids, std::size_t n, std::size_t limit,
                                     float ignore_index, IndexCheckRecord* record) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    if (!math::valid_index(ids[i], limit, ignore_index)) record_failed_check(record, check, ids[i], limit);
}

}  // namespace

void CudaKernels::fill(float* out, std::size_t n, float value) {
  if (!n) return;
  fill_kernel<<<blocks_for(n), kThreads>>>(out, n, value);
  check_launch();
}

void CudaKernels::fill_bits(std::uint16_t* out, std::size_t n, std::uint16_t bits) {
  if (!n) return;
  fill_bits_kernel<<<blocks_for(n), kThreads>>>(out, n, bits);
  check_launch();
}

void CudaKernels::copy(float* out, const float* in, std::size_t n) {
  if (n) COURSE_CUDA_CHECK(cudaMemcpy(out, in, n * sizeof(float), cudaMemcpyDeviceToDevice));
}

void CudaKernels::arange(float* out, std::size_t n) {
  if (!n) return;
  arange_kernel<<<blocks_for(n), kThreads>>>(out, n);
  check_launch();
}

void CudaKernels::dropout(const float* in, float* out, std::size_t n, float p, std::uint64_t seed, std::uint64_t first) {
  if (!n) return;
  dropout_kernel<<<blocks_for(n), kThreads>>>(in, out, n, p, seed, first);
  check_launch();
}

void CudaKernels::check_indices(IndexCheck check, const float* ids, std::size_t n, std::size_t limit, float ignore_index) {
  if (!n) return;
  check_indices_kernel<<<blocks_for(n), kThreads>>>(check, ids, n, limit, ignore_index, check_record());
  check_launch();
}

Kernels& cuda_kernels() {
  static CudaKernels instance;
  return instance;
}

}  // namespace course
