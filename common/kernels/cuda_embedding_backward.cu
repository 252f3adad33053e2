// The embedding's gradient, a scatter-add made deterministic and parallel. Atomics would add a row's
// tokens in whatever order the threads arrive; one thread per column walking all n tokens (8192 at
// GPT-2's batch) leaves most of the GPU idle. Instead the token positions are sorted by id with CUB's
// stable radix sort (positions of one id stay in increasing order), the runs of equal ids found
// (CUB's run-length encoding, then an exclusive scan for where each run starts), and one thread per
// (id, column) adds its run's rows in order: each element gets exactly the CPU's additions, in the
// CPU's order, so the bits are the CPU's (kernel_parity_test), and the work is spread over every
// (distinct token, column) pair.
#include "common/kernels/cuda_embedding_backward.h"

#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_run_length_encode.cuh>
#include <cub/device/device_scan.cuh>

#include "common/core/cuda_check.h"
#include "common/core/cuda_runtime.h"
#include "common/kernels/math.h"
#include "common/kernels/rounded.h"

namespace course::cuda_embedding {
namespace {

constexpr int kThreads = 256;

// Keys and positions to sort: a valid id is its own key, an invalid one sorts last (key vocab).
__global__ void embedding_keys_kernel(const float* ids, std::size_t n, std::size_t vocab, int* keys, int* positions) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    keys[i] = math::valid_index(ids[i], vocab, NAN) ? static_cast<int>(ids[i]) : static_cast<int>(vocab);
    positions[i] = static_cast<int>(i);
  }
}

// Thread (run r, column d): grad_weight[id of run r][d] = its rows' grad_out[i][d], added in increasing i.
__global__ void embedding_runs_kernel(const int* run_ids, const int* run_starts, const int* run_lengths,
                                      const int* run_count, const int* positions, const float* g, std::size_t dim,
                                      std::size_t vocab, float* dw) {
  const int runs = *run_count;
  const std::size_t total = static_cast<std::size_t>(runs) * dim;
  for (std::size_t e = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const std::size_t r = e / dim, d = e % dim;
    if (run_ids[r] >= static_cast<int>(vocab)) continue;  // the invalid ids' run
    float sum = 0.0f;
    for (int k = run_starts[r], end = run_starts[r] + run_lengths[r]; k < end; ++k)
      sum = rn::add(sum, g[static_cast<std::size_t>(positions[k]) * dim + d]);
    dw[static_cast<std::size_t>(run_ids[r]) * dim + d] = sum;
  }
}

unsigned blocks_for(std::size_t n) {
  const std::size_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 65535 ? (blocks ? blocks : 1) : 65535);
}

// Device scratch from the caching pool, released at the end of the call (the stream runs in order).
class Scratch {
 public:
  explicit Scratch(std::size_t bytes) : bytes_(bytes ? bytes : 1), p_(cuda::allocate(bytes_)) {}
  ~Scratch() { cuda::release(p_, bytes_); }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  template <class T>
  T* as() const { return static_cast<T*>(p_); }

 private:
  std::size_t bytes_;
  void* p_;
};

}  // namespace

void backward(const float* ids, const float* g, std::size_t n, std::size_t dim, std::size_t vocab, float* dw) {
  COURSE_CUDA_CHECK(cudaMemsetAsync(dw, 0, vocab * dim * sizeof(float)));  // ids that never appear: 0
  if (!n || !dim) return;
  const int count = static_cast<int>(n);
  Scratch keys(n * sizeof(int)), positions(n * sizeof(int)), sorted_keys(n * sizeof(int)),
      sorted_positions(n * sizeof(int)), run_ids(n * sizeof(int)), run_lengths(n * sizeof(int)),
      run_starts(n * sizeof(int)), run_count(sizeof(int));
  COURSE_CUDA_CHECK(cudaMemsetAsync(run_lengths.as<int>(), 0, n * sizeof(int)));  // past the runs: 0, scanned
  embedding_keys_kernel<<<blocks_for(n), kThreads>>>(ids, n, vocab, keys.as<int>(), positions.as<int>());
  COURSE_CUDA_CHECK(cudaGetLastError());
  // Enough key bits for ids up to vocab (the invalid ones' key).
  int bits = 1;
  while ((std::size_t{1} << bits) <= vocab) ++bits;
  std::size_t sort_bytes = 0, encode_bytes = 0, scan_bytes = 0;
  COURSE_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, keys.as<int>(), sorted_keys.as<int>(),
                                                    positions.as<int>(), sorted_positions.as<int>(), count, 0, bits));
  COURSE_CUDA_CHECK(cub::DeviceRunLengthEncode::Encode(nullptr, encode_bytes, sorted_keys.as<int>(), run_ids.as<int>(),
                                                       run_lengths.as<int>(), run_count.as<int>(), count));
  COURSE_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(nullptr, scan_bytes, run_lengths.as<int>(), run_starts.as<int>(), count));
  Scratch temporary(std::max(sort_bytes, std::max(encode_bytes, scan_bytes)));
  COURSE_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temporary.as<void>(), sort_bytes, keys.as<int>(), sorted_keys.as<int>(),
                                                    positions.as<int>(), sorted_positions.as<int>(), count, 0, bits));
  COURSE_CUDA_CHECK(cub::DeviceRunLengthEncode::Encode(temporary.as<void>(), encode_bytes, sorted_keys.as<int>(),
                                                       run_ids.as<int>(), run_lengths.as<int>(), run_count.as<int>(), count));
  // The scan over all n (the lengths past the last run are 0): the host need not wait to learn the count.
  COURSE_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(temporary.as<void>(), scan_bytes, run_lengths.as<int>(),
                                                  run_starts.as<int>(), count));
  embedding_runs_kernel<<<blocks_for(n * dim), kThreads>>>(run_ids.as<int>(), run_starts.as<int>(), run_lengths.as<int>(),
                                                           run_count.as<int>(), sorted_positions.as<int>(), g, dim,
                                                           vocab, dw);
  COURSE_CUDA_CHECK(cudaGetLastError());
}

}  // namespace course::cuda_embedding
