// The CPU GEMM's dispatch: oneDNN when built with it, OpenBLAS otherwise.
#include "common/kernels/cpu_gemm.h"

#include <cblas.h>

#include <atomic>
#include <cstdio>
#include <string>

#ifdef _OPENMP
#include <omp.h>
#endif
#if COURSE_HAVE_DNNL
#include <oneapi/dnnl/dnnl.h>
#endif

namespace course::cpu {
namespace {
std::atomic<int> g_gemm_threads{0};  // 0: OpenMP's own setting
}  // namespace

void set_gemm_threads(int threads) {
  g_gemm_threads = threads;
  openblas_set_num_threads(threads);
}

void sgemm(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const float* a,
           std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c, std::int64_t ldc) {
#if COURSE_HAVE_DNNL
#ifdef _OPENMP
  const int threads = g_gemm_threads;
  if (threads > 0 && !omp_in_parallel() && omp_get_max_threads() != threads) omp_set_num_threads(threads);
#endif
  // oneDNN's sgemm is row-major, as the library's tensors; it reports only bad arguments, which the
  // callers have ruled out.
  dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
#else
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, static_cast<int>(m),
              static_cast<int>(n), static_cast<int>(k), alpha, a, static_cast<int>(lda), b, static_cast<int>(ldb), beta,
              c, static_cast<int>(ldc));
#endif
}

const char* gemm_library() {
  static const std::string name = [] {
#if COURSE_HAVE_DNNL
    const dnnl_version_t* v = dnnl_version();
    return "oneDNN " + std::to_string(v->major) + "." + std::to_string(v->minor) + "." + std::to_string(v->patch);
#else
    std::string config = openblas_get_config();  // "OpenBLAS 0.3.21 DYNAMIC_ARCH ..."
    return config.substr(0, config.find(' ', config.find(' ') + 1));
#endif
  }();
  return name.c_str();
}

}  // namespace course::cpu
