// Error checking for CUDA runtime and cuBLAS calls: a failure becomes an exception naming the call.
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#define COURSE_CUDA_CHECK(call)                                                                \
  do {                                                                                         \
    cudaError_t course_err_ = (call);                                                          \
    if (course_err_ != cudaSuccess)                                                            \
      throw std::runtime_error(std::string(#call) + ": " + cudaGetErrorString(course_err_));  \
  } while (0)

#define COURSE_CUBLAS_CHECK(call)                                                               \
  do {                                                                                          \
    cublasStatus_t course_status_ = (call);                                                     \
    if (course_status_ != CUBLAS_STATUS_SUCCESS)                                                \
      throw std::runtime_error(std::string(#call) + ": cuBLAS status " +                       \
                               std::to_string(static_cast<int>(course_status_)));               \
  } while (0)
