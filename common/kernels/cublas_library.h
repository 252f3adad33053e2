// cuBLAS, opened the first time a GEMM runs on a GPU, not when the program starts.
//
// Linked the usual way, libcublas (and libcublasLt, which it needs) is loaded with the program, and
// libcublasLt's start-up code fills tens of megabytes: 55 of the 80 ms a chapter took to print its
// --help, in every process of every run, on a machine without a GPU as on one with it. Opened with
// dlopen at the first use instead, it costs nothing to a run on the CPU. The functions keep their
// cuBLAS types (decltype of the declarations in cublas_v2.h), so a call through them is checked by the
// compiler as a direct call is.
#pragma once
#include <cublas_v2.h>

namespace course::cublas {

// cublas_api.h adds an inline C++ overload of cublasGemmStridedBatchedEx (the older cudaDataType_t
// compute type), so its exported form is spelled out; cublas_library.cpp checks it against the header.
using GemmStridedBatchedEx = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                                                const void*, const void*, cudaDataType, int, long long int,
                                                const void*, cudaDataType, int, long long int, const void*, void*,
                                                cudaDataType, int, long long int, int, cublasComputeType_t,
                                                cublasGemmAlgo_t);

struct Functions {
  decltype(&::cublasCreate_v2) create;
  decltype(&::cublasSetMathMode) set_math_mode;
  decltype(&::cublasSgemm_v2) sgemm;
  decltype(&::cublasSgemmStridedBatched) sgemm_strided_batched;
  GemmStridedBatchedEx gemm_strided_batched_ex;
};

// The library's functions, opening it on the first call (its soname, libcublas.so.<major> of the
// headers this was built with, as the loader finds it; then the toolkit's folder this was built
// against). Throws std::runtime_error naming the library and dlerror()'s reason when it cannot.
const Functions& functions();

// Whether this process has opened cuBLAS yet (for the test that a run on the CPU never does).
bool opened();

}  // namespace course::cublas
