// The CPU's GEMM: oneDNN's sgemm where the course was built with oneDNN (Debian's libdnnl-dev: JIT kernels
// for this CPU's vector units, a few percent to 15% faster than OpenBLAS on the GPT's shapes), OpenBLAS's
// otherwise. Every CPU GEMM of the library goes through here.
#pragma once
#include <cstdint>

namespace course::cpu {

// Row-major C[m, n] = alpha op(A) op(B) + beta C, with leading dimensions (so a GEMM can read a matrix
// in place inside a larger one). m, n, k > 0.
void sgemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const float* a,
           std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c, std::int64_t ldc);

// "oneDNN 2.6.3" or "OpenBLAS 0.3.21": which library the GEMMs run on, for the benchmarks to print.
const char* gemm_library();

// Threads for the GEMMs (set_cpu_threads's gemm_threads): OpenBLAS keeps a setting of its own; oneDNN
// takes OpenMP's, which belongs to the calling thread, so sgemm applies it on every thread that calls.
void set_gemm_threads(int threads);

}  // namespace course::cpu
