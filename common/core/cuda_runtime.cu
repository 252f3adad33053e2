// CUDA runtime helpers: device queries, the caching device allocator, pinned memory and copies.
#include <atomic>
#include <cstring>
#include <map>
#include <mutex>
#include <vector>

#include "common/core/cuda_check.h"
#include "common/core/cuda_runtime.h"
#include "common/core/index_check.h"

namespace course::cuda {

int device_count(std::string* error) {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    if (error) *error = cudaGetErrorString(err);
    cudaGetLastError();  // clear the sticky error so later queries start clean
    return 0;
  }
  if (count == 0 && error) *error = "no CUDA device found";
  return count;
}

void set_device(int index) { COURSE_CUDA_CHECK(cudaSetDevice(index)); }

int current_device() {
  int device = 0;
  COURSE_CUDA_CHECK(cudaGetDevice(&device));
  return device;
}

void synchronize() { COURSE_CUDA_CHECK(cudaDeviceSynchronize()); }

std::string device_product_name() {
  cudaDeviceProp properties{};
  COURSE_CUDA_CHECK(cudaGetDeviceProperties(&properties, current_device()));
  return properties.name;
}

namespace {
// Blocks are rounded up to 512 bytes and kept in per-size free lists, per device.
constexpr std::size_t kBlockRounding = 512;
std::size_t rounded(std::size_t bytes) {
  return (bytes + kBlockRounding - 1) / kBlockRounding * kBlockRounding;
}
struct Pool {
  std::mutex mutex;
  std::map<std::pair<int, std::size_t>, std::vector<void*>> free_blocks;  // (device, size); -1 = pinned host
};
Pool& pool() {
  static Pool* instance = new Pool;  // never destroyed: tensors may be freed during static teardown
  return *instance;
}
constexpr int kPinnedHost = -1;
void* take_cached(int device, std::size_t size) {
  std::lock_guard<std::mutex> lock(pool().mutex);
  auto it = pool().free_blocks.find({device, size});
  if (it == pool().free_blocks.end() || it->second.empty()) return nullptr;
  void* ptr = it->second.back();
  it->second.pop_back();
  return ptr;
}
}  // namespace

void* allocate(std::size_t bytes) {
  if (bytes == 0) return nullptr;
  std::size_t size = rounded(bytes);
  int device = current_device();
  if (void* cached = take_cached(device, size)) return cached;
  void* ptr = nullptr;
  if (cudaMalloc(&ptr, size) != cudaSuccess) {
    cudaGetLastError();
    // Out of memory: give the cached blocks back to the driver and try once more.
    std::lock_guard<std::mutex> lock(pool().mutex);
    for (auto it = pool().free_blocks.begin(); it != pool().free_blocks.end();) {
      if (it->first.first == kPinnedHost) {
        ++it;
        continue;
      }
      for (void* block : it->second) cudaFree(block);
      it = pool().free_blocks.erase(it);
    }
    COURSE_CUDA_CHECK(cudaMalloc(&ptr, size));
  }
  return ptr;
}

void release(void* ptr, std::size_t bytes) {
  if (!ptr) return;
  std::lock_guard<std::mutex> lock(pool().mutex);
  pool().free_blocks[{current_device(), rounded(bytes)}].push_back(ptr);
}

void* allocate_pinned(std::size_t bytes) {
  if (bytes == 0) return nullptr;
  std::size_t size = rounded(bytes);
  if (void* cached = take_cached(kPinnedHost, size)) return cached;
  void* ptr = nullptr;
  COURSE_CUDA_CHECK(cudaMallocHost(&ptr, size));
  return ptr;
}

void release_pinned(void* ptr, std::size_t bytes) {
  if (!ptr) return;
  std::lock_guard<std::mutex> lock(pool().mutex);
  pool().free_blocks[{kPinnedHost, rounded(bytes)}].push_back(ptr);
}

namespace {
std::atomic<void*> index_check_host{nullptr};
std::mutex index_check_mutex;
}  // namespace

void* index_check_record_host() { return index_check_host.load(); }

void* index_check_record_device() {
  std::lock_guard<std::mutex> lock(index_check_mutex);
  if (!index_check_host.load()) {
    void* host = nullptr;
    COURSE_CUDA_CHECK(cudaHostAlloc(&host, sizeof(IndexCheckRecord), cudaHostAllocMapped));
    std::memset(host, 0, sizeof(IndexCheckRecord));
    index_check_host = host;
  }
  void* device = nullptr;
  COURSE_CUDA_CHECK(cudaHostGetDevicePointer(&device, index_check_host.load(), 0));
  return device;
}

void copy(void* dst, const void* src, std::size_t bytes, CopyKind kind) {
  if (bytes == 0) return;
  cudaMemcpyKind k = kind == CopyKind::host_to_device   ? cudaMemcpyHostToDevice
                     : kind == CopyKind::device_to_host ? cudaMemcpyDeviceToHost
                                                        : cudaMemcpyDeviceToDevice;
  COURSE_CUDA_CHECK(cudaMemcpy(dst, src, bytes, k));
}

}  // namespace course::cuda

namespace course::cuda {

void* event_create() {
  cudaEvent_t event;
  COURSE_CUDA_CHECK(cudaEventCreate(&event));
  return event;
}
void event_destroy(void* event) {
  if (event) cudaEventDestroy(static_cast<cudaEvent_t>(event));
}
void event_record(void* event) { COURSE_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(event))); }
float event_elapsed_ms(void* start, void* stop) {
  COURSE_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(stop)));
  float ms = 0.0f;
  COURSE_CUDA_CHECK(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(start), static_cast<cudaEvent_t>(stop)));
  return ms;
}

}  // namespace course::cuda
