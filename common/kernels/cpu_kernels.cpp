// CPU kernels, the reference implementation of every op (cpu_kernels.h lists where each family lives):
// here the fills, copies, dropout and index checks, the backend chosen by device, and the settings every
// kernel reads (TF32 on a GPU, the CPU's threads).
#include <algorithm>
#include <atomic>
#include <stdexcept>

#include "common/kernels/cpu_gemm.h"
#include "common/kernels/cpu_kernels.h"
#include "common/kernels/rounded.h"

namespace course {
using namespace cpu_loops;

void CpuKernels::fill(float* out, std::size_t n, float value) {
  parallel_for(n, 1, [&](std::size_t b, std::size_t e) { std::fill(out + b, out + e, value); });
}

void CpuKernels::fill_bits(std::uint16_t* out, std::size_t n, std::uint16_t bits) {
  parallel_for(n, 1, [&](std::size_t b, std::size_t e) { std::fill(out + b, out + e, bits); });
}

void CpuKernels::copy(float* out, const float* in, std::size_t n) {
  parallel_for(n, 1, [&](std::size_t b, std::size_t e) { std::copy(in + b, in + e, out + b); });
}

void CpuKernels::arange(float* out, std::size_t n) {
  elementwise(n, [&](std::size_t i) { out[i] = static_cast<float>(i); });
}

void CpuKernels::dropout(const float* in, float* out, std::size_t n, float p, std::uint64_t seed, std::uint64_t first) {
  elementwise(n, [&](std::size_t i) { out[i] = rn::mul(in[i], math::dropout_keep(seed, first + i, p)); });
}

void CpuKernels::check_indices(IndexCheck check, const float* ids, std::size_t n, std::size_t limit, float ignore_index) {
  for (std::size_t i = 0; i < n; ++i)
    if (!math::valid_index(ids[i], limit, ignore_index))
      throw std::invalid_argument(index_check_message(check, ids[i], limit));
}

Kernels& cpu_kernels() {
  static CpuKernels instance;
  return instance;
}

#if COURSE_HAVE_CUDA
Kernels& cuda_kernels();  // cuda_kernels.cu
#endif

namespace {
std::atomic<bool>& tf32_setting() {
  static std::atomic<bool> allowed{false};
  return allowed;
}
}  // namespace

void set_allow_tf32(bool allow) { tf32_setting() = allow; }
bool allow_tf32() { return tf32_setting(); }

Kernels& cpu_kernels_without_half();  // cpu_emulated_half.cpp

Kernels& kernels(Device device) {
  if (device == Device::cpu) return EmulatedHalfKernels::active() ? cpu_kernels_without_half() : cpu_kernels();
#if COURSE_HAVE_CUDA
  return cuda_kernels();
#else
  throw std::runtime_error("a CUDA kernel was requested in a build without the CUDA backend");
#endif
}

namespace {
// One setting for the whole process. OpenMP's own (omp_set_num_threads) belongs to the calling thread
// only, and chapter 05's communication thread runs kernels too: it would still use every core, and
// ranks sharing a machine would fight over them.
std::atomic<int>& thread_setting() {
#ifdef _OPENMP
  static std::atomic<int> threads{omp_get_max_threads()};  // OMP_NUM_THREADS, or every core
#else
  static std::atomic<int> threads{1};
#endif
  return threads;
}
}  // namespace

void set_cpu_threads(int threads, int gemm_threads) {
  threads = std::max(1, threads);
  thread_setting() = threads;
  cpu::set_gemm_threads(gemm_threads > 0 ? gemm_threads : threads);
}
int cpu_threads() { return thread_setting(); }

}  // namespace course
