// The GEMMs on the GPU: cuBLAS (opened at its first use, cublas_library.h), float32 without TF32 unless
// allowed, 16-bit operands in 16-bit GEMMs with float32 accumulation.
#include <cublas_v2.h>

#include <mutex>

#include "common/kernels/cublas_library.h"

#include "common/kernels/cuda_kernels.h"

namespace course {
using namespace cuda_launch;
namespace {

cublasMath_t float32_math() { return allow_tf32() ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_PEDANTIC_MATH; }

cublasHandle_t cublas_handle() {
  static std::mutex mutex;
  static cublasHandle_t handles[64] = {};
  int device = 0;
  COURSE_CUDA_CHECK(cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(mutex);
  if (!handles[device]) COURSE_CUBLAS_CHECK(cublas::functions().create(&handles[device]));
  // Plain FP32, so GPU results stay comparable with the CPU reference, unless TF32 is allowed
  // (set_allow_tf32, --tf32); set at every call, as the setting may change between them.
  COURSE_CUBLAS_CHECK(cublas::functions().set_math_mode(handles[device], float32_math()));
  return handles[device];
}

}  // namespace

// cuBLAS is column-major: a row-major C = op(A) op(B) is the column-major C^T = op(B)^T op(A)^T.
void CudaKernels::gemm(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const float* a,
          const float* b, float beta, float* c) {
  if (m == 0 || n == 0) return;
  if (k == 0) {
    if (beta == 0.0f) fill(c, static_cast<std::size_t>(m * n), 0.0f);
    else scale(c, beta, c, static_cast<std::size_t>(m * n));
    return;
  }
  COURSE_CUBLAS_CHECK(cublas::functions().sgemm(cublas_handle(), tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                                  static_cast<int>(n), static_cast<int>(m), static_cast<int>(k), &alpha, b,
                                  static_cast<int>(tb ? k : n), a, static_cast<int>(ta ? m : k), &beta, c,
                                  static_cast<int>(n)));
}

void CudaKernels::gemm_batched(bool ta, bool tb, std::int64_t batch, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
                  const float* a, std::int64_t sa, const float* b, std::int64_t sb, float beta, float* c,
                  std::int64_t sc) {
  if (batch == 0 || m == 0 || n == 0) return;
  if (k == 0) {
    for (std::int64_t i = 0; i < batch; ++i) gemm(ta, tb, m, n, k, alpha, a, b, beta, c + i * sc);
    return;
  }
  // Column-major, as in gemm: each C^T = op(B)^T op(A)^T.
  COURSE_CUBLAS_CHECK(cublas::functions().sgemm_strided_batched(
      cublas_handle(), tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, static_cast<int>(n),
      static_cast<int>(m), static_cast<int>(k), &alpha, b, static_cast<int>(tb ? k : n), sb, a,
      static_cast<int>(ta ? m : k), sa, &beta, c, static_cast<int>(n), sc, static_cast<int>(batch)));
}

// 16-bit operands, float32 accumulation (CUBLAS_COMPUTE_32F) on tensor cores: the handle's pedantic
// math mode, which keeps the float32 GEMMs off TF32, is lifted for these calls, whose inputs are
// 16-bit already.
void CudaKernels::gemm_batched_half(HalfFormat format, bool ta, bool tb, std::int64_t batch, std::int64_t m, std::int64_t n,
                       std::int64_t k, float alpha, const std::uint16_t* a, std::int64_t sa, const std::uint16_t* b,
                       std::int64_t sb, float beta, std::uint16_t* c, std::int64_t sc) {
  if (batch == 0 || m == 0 || n == 0) return;
  if (k == 0) {  // no products: C = beta C, through float32
    DeviceBuffer wide(static_cast<std::size_t>(m * n));
    for (std::int64_t i = 0; i < batch; ++i) {
      from_half(format, c + i * sc, wide.get(), static_cast<std::size_t>(m * n));
      scale(wide.get(), beta, wide.get(), static_cast<std::size_t>(m * n));
      to_half(format, wide.get(), c + i * sc, static_cast<std::size_t>(m * n));
    }
    return;
  }
  const cudaDataType type = format == HalfFormat::bfloat16 ? CUDA_R_16BF : CUDA_R_16F;
  cublasHandle_t handle = cublas_handle();
  COURSE_CUBLAS_CHECK(cublas::functions().set_math_mode(handle, CUBLAS_DEFAULT_MATH));
  // Column-major, as in gemm: each C^T = op(B)^T op(A)^T.
  const cublasStatus_t status = cublas::functions().gemm_strided_batched_ex(
      handle, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, static_cast<int>(n),
      static_cast<int>(m), static_cast<int>(k), &alpha, b, type, static_cast<int>(tb ? k : n), sb, a, type,
      static_cast<int>(ta ? m : k), sa, &beta, c, type, static_cast<int>(n), sc, static_cast<int>(batch),
      CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  COURSE_CUBLAS_CHECK(cublas::functions().set_math_mode(handle, float32_math()));
  COURSE_CUBLAS_CHECK(status);
}

}  // namespace course
