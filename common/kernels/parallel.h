// Threads for the CPU kernels' loops (OpenMP): [0, n) cut into one contiguous chunk per thread, each
// chunk a plain loop the compiler vectorises. Every element (every row, every column of a reduction)
// is computed by exactly one thread with the same instructions as on one thread, so the results are the
// same bits at any thread count. Small loops stay on the calling thread: waking the others costs a few
// microseconds, more than they would save.
#pragma once
#include <cstddef>

#ifdef _OPENMP
#include <omp.h>
#endif

namespace course {

int cpu_threads();  // set_cpu_threads in kernels.h

// Below about this many element operations a loop runs on one thread.
constexpr std::size_t kParallelGrain = 32768;

// body(begin, end) over [0, n); `cost` is the work per index in element operations (a row's length
// for a loop over rows), so the grain is judged on the whole loop's work.
template <class Body>
void parallel_for(std::size_t n, std::size_t cost, Body body) {
#ifdef _OPENMP
  const int threads = cpu_threads();
  if (threads > 1 && n > 1 && n * cost >= kParallelGrain && !omp_in_parallel()) {
#pragma omp parallel num_threads(static_cast<int>(threads < static_cast<int>(n) ? threads : static_cast<int>(n)))
    {
      const auto t = static_cast<std::size_t>(omp_get_thread_num()), count = static_cast<std::size_t>(omp_get_num_threads());
      const std::size_t begin = n * t / count, end = n * (t + 1) / count;
      if (begin < end) body(begin, end);
    }
    return;
  }
#else
  (void)cost;
#endif
  if (n > 0) body(std::size_t{0}, n);
}

}  // namespace course
