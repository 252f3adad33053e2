// The CPU caching allocator: free lists keyed by size, under one mutex (the communication thread of
// chapter 05 allocates too).
#include "common/core/cpu_allocator.h"

#include <cstdlib>
#include <malloc.h>
#include <mutex>
#include <new>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace course::cpu_allocator {
namespace {

constexpr std::size_t kAlignment = 64;                  // one cache line; also what AVX-512 loads prefer
constexpr std::size_t kRound = 512;                     // sizes round up to this, as PyTorch's block size
constexpr std::size_t kCacheLimit = std::size_t{1} << 31;  // 2 GiB cached at most; beyond, blocks go back

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif

std::size_t rounded(std::size_t bytes) { return (bytes + kRound - 1) / kRound * kRound; }

struct Cache {
  std::mutex mutex;
  std::unordered_map<std::size_t, std::vector<void*>> free_blocks;
  std::size_t cached = 0;
  bool enabled = !kSanitized && !(std::getenv("COURSE_NO_MEMORY_CACHING") &&
                                  std::string_view(std::getenv("COURSE_NO_MEMORY_CACHING")) == "1");
};
Cache& cache() {
  static Cache* instance = new Cache;  // never destroyed: static tensors are freed during teardown
  return *instance;
}

void release_all(Cache& c) {  // with the mutex held
  for (auto& [size, blocks] : c.free_blocks)
    for (void* block : blocks) std::free(block);
  c.free_blocks.clear();
  c.cached = 0;
}

}  // namespace

void* allocate(std::size_t bytes) {
  const std::size_t size = rounded(bytes);
  Cache& c = cache();
  if (c.enabled) {
    std::lock_guard<std::mutex> lock(c.mutex);
    auto it = c.free_blocks.find(size);
    if (it != c.free_blocks.end() && !it->second.empty()) {
      void* ptr = it->second.back();
      it->second.pop_back();
      c.cached -= size;
      return ptr;
    }
  }
  void* ptr = std::aligned_alloc(kAlignment, size);
  if (!ptr && c.enabled) {  // out of memory: give the cache back and try once more
    std::lock_guard<std::mutex> lock(c.mutex);
    release_all(c);
    ptr = std::aligned_alloc(kAlignment, size);
  }
  if (!ptr) throw std::bad_alloc();
  return ptr;
}

void release(void* ptr, std::size_t bytes) {
  if (!ptr) return;
  const std::size_t size = rounded(bytes);
  Cache& c = cache();
  if (c.enabled) {
    std::lock_guard<std::mutex> lock(c.mutex);
    if (c.cached + size <= kCacheLimit) {
      c.free_blocks[size].push_back(ptr);
      c.cached += size;
      return;
    }
  }
  std::free(ptr);
}

std::size_t cached_bytes() {
  std::lock_guard<std::mutex> lock(cache().mutex);
  return cache().cached;
}

void empty_cache() {
  std::lock_guard<std::mutex> lock(cache().mutex);
  release_all(cache());
}

bool caching_enabled() { return cache().enabled; }

void keep_freed_host_memory() {
  if (!cache().enabled) return;
  constexpr int kHeld = 1 << 30;  // blocks up to 1 GiB from the heap; the heap's top given back beyond 1 GiB free
  mallopt(M_MMAP_THRESHOLD, kHeld);
  mallopt(M_TRIM_THRESHOLD, kHeld);
}

}  // namespace course::cpu_allocator
