// The CPU GEMM's dispatch: oneDNN when built with it, OpenBLAS otherwise.
#include "common/kernels/cpu_gemm.h"
#include "common/kernels/cpu_kernels.h"

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

// The CPU backend's kernels of this family (cpu_kernels.h).
namespace course {
using namespace cpu_loops;

void CpuKernels::gemm(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const float* a,
          const float* b, float beta, float* c) {
  if (m == 0 || n == 0) return;
  if (k == 0) {  // BLAS leaves C untouched for k == 0 only when beta == 1
    for (std::int64_t i = 0; i < m * n; ++i) c[i] = beta == 0.0f ? 0.0f : beta * c[i];
    return;
  }
  cpu::sgemm(ta, tb, m, n, k, alpha, a, ta ? m : k, b, tb ? k : n, beta, c, n);
}

void CpuKernels::gemm_batched(bool ta, bool tb, std::int64_t batch, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
                  const float* a, std::int64_t sa, const float* b, std::int64_t sb, float beta, float* c,
                  std::int64_t sc) {
  // Attention's GEMMs are many and tiny (one per sequence and head): the threads take whole matrices
  // (OpenBLAS runs single-threaded inside an OpenMP region), as PyTorch's bmm does on the CPU.
  parallel_for(static_cast<std::size_t>(batch), static_cast<std::size_t>(m * n * std::max<std::int64_t>(k, 1)),
               [&](std::size_t first, std::size_t end) {
                 for (auto i = static_cast<std::int64_t>(first); i < static_cast<std::int64_t>(end); ++i)
                   gemm(ta, tb, m, n, k, alpha, a + i * sa, b + i * sb, beta, c + i * sc);
               });
}

void CpuKernels::gemm_batched_half(HalfFormat format, bool ta, bool tb, std::int64_t batch, std::int64_t m, std::int64_t n,
                       std::int64_t k, float alpha, const std::uint16_t* a, std::int64_t sa, const std::uint16_t* b,
                       std::int64_t sb, float beta, std::uint16_t* c, std::int64_t sc) {
  if (batch == 0 || m == 0 || n == 0) return;
  // Every element the strided matrices reach, widened once; C's rounding is the only one.
  auto span = [batch](std::int64_t stride, std::int64_t size) { return static_cast<std::size_t>((batch - 1) * stride + size); };
  std::vector<float> wa(span(sa, m * k)), wb(span(sb, k * n)), wc(span(sc, m * n), 0.0f);
  from_half(format, a, wa.data(), wa.size());
  from_half(format, b, wb.data(), wb.size());
  if (beta != 0.0f) from_half(format, c, wc.data(), wc.size());
  gemm_batched(ta, tb, batch, m, n, k, alpha, wa.data(), sa, wb.data(), sb, beta, wc.data(), sc);
  for (std::int64_t i = 0; i < batch; ++i)
    to_half(format, wc.data() + i * sc, c + i * sc, static_cast<std::size_t>(m * n));
}

}  // namespace course
