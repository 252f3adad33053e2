// The few CUDA runtime calls the rest of the library needs, behind plain C++ declarations.
// Implemented in cuda_runtime.cu, which is compiled only when the CUDA backend is built.
#pragma once
#include <cstddef>
#include <string>

namespace course::cuda {

int device_count(std::string* error);  // 0 with the reason in *error when no GPU is usable
void set_device(int index);
int current_device();
void synchronize();
std::string device_product_name();  // the current GPU's, as "NVIDIA H100 80GB HBM3"

// Device memory through a small caching pool: cudaFree synchronises the whole device, so freed
// blocks are kept for reuse instead of being returned (the idea behind PyTorch's caching allocator).
void* allocate(std::size_t bytes);
void release(void* ptr, std::size_t bytes);
// Page-locked host memory for staging transfers, pooled the same way: cudaFreeHost synchronises too.
void* allocate_pinned(std::size_t bytes);
void release_pinned(void* ptr, std::size_t bytes);

// The GPU's record of failed index checks (common/core/index_check.h): page-locked host memory mapped into
// the device, which kernels write and the host reads without a copy. The host's pointer is null until a
// kernel first asked for the device's.
void* index_check_record_host();
void* index_check_record_device();

enum class CopyKind { host_to_device, device_to_host, device_to_device };
void copy(void* dst, const void* src, std::size_t bytes, CopyKind kind);

}  // namespace course::cuda

namespace course::cuda {
// CUDA events for timing, as opaque pointers so callers need no CUDA headers.
void* event_create();
void event_destroy(void* event);
void event_record(void* event);                     // on the default (compute) stream
float event_elapsed_ms(void* start, void* stop);    // waits for `stop`
}  // namespace course::cuda
