// A caching allocator for CPU tensor storage, as PyTorch's CUDA caching allocator (and ours, in
// cuda_runtime.cu) does for the GPU: a freed block goes to a free list by its rounded size and is handed
// to the next request of that size. A training loop asks for the same sizes every step, so after the
// first step it stops paying the kernel for fresh pages (mmap, a page fault per 4 KiB, zeroing, munmap),
// which was a tenth of a small MLP's step. The memory counters (memory.h) count live tensors, never the
// cache, so chapter 07's per-category numbers are unchanged by it.
//
// Off in sanitizer builds, where a cached block would hide a use after free from AddressSanitizer, and
// when COURSE_NO_MEMORY_CACHING=1 is set (PyTorch's PYTORCH_NO_CUDA_MEMORY_CACHING).
#pragma once
#include <cstddef>

namespace course::cpu_allocator {

void* allocate(std::size_t bytes);               // 64-byte aligned; throws std::bad_alloc
void release(void* ptr, std::size_t bytes);      // `bytes` as allocated
std::size_t cached_bytes();                      // held in free lists, not in use
void empty_cache();                              // gives every cached block back to the system
bool caching_enabled();

// The same for the program's other host memory, the std::vectors of millions of floats a verified run
// fills at every step: glibc's malloc is told to keep what is freed (no mmap of its own for a large block,
// no trimming), so the next step reuses those pages instead of faulting in and zeroing fresh ones, which
// took a third of chapter 05's --verify. Called once, at start-up (cli::run); off with the cache.
void keep_freed_host_memory();

}  // namespace course::cpu_allocator
