// Memory accounting: every byte a tensor allocates is counted, per device and per category, as current
// and peak bytes. ZeRO (chapter 07) reports memory from these counters, so they are exact: a storage
// adds its size when it is allocated and subtracts the same size when it is freed.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "common/core/device.h"

namespace course {

// offloaded: what ZeRO-Offload keeps in host memory instead of the device's (common/parallel/zero.h);
// verification: a lock-step reference's model and passes (common/verify/lockstep.h). Both are counted
// apart from the run's memory on its device: outside the totals, the peaks of the other categories and
// any budget. (On a CPU-only run the host is the device, and this is what keeps the two apart.)
enum class MemoryCategory {
  parameters, gradients, optimizer_state, activations, communication, offloaded, verification, count
};
// Whether a category counts in a device's totals and against its budget (all but the two above).
constexpr bool counts_on_device(MemoryCategory c) {
  return c != MemoryCategory::offloaded && c != MemoryCategory::verification;
}
constexpr std::size_t kMemoryCategories = static_cast<std::size_t>(MemoryCategory::count);
const char* memory_category_name(MemoryCategory category);

struct MemoryStats {
  std::array<std::int64_t, kMemoryCategories> current{};
  std::array<std::int64_t, kMemoryCategories> peak{};
  std::int64_t current_total = 0;
  std::int64_t peak_total = 0;
  std::int64_t current_of(MemoryCategory c) const { return current[static_cast<std::size_t>(c)]; }
  std::int64_t peak_of(MemoryCategory c) const { return peak[static_cast<std::size_t>(c)]; }
};

MemoryStats memory_stats(Device device);
// Restarts peak tracking from the current usage (e.g. before measuring one training step).
void reset_peak_memory(Device device);

// Allocations made while a scope is alive are counted under its category. Tensors made outside any
// scope count as activations, the category of everything a forward pass creates.
class MemoryCategoryScope {
 public:
  explicit MemoryCategoryScope(MemoryCategory category);
  ~MemoryCategoryScope();
  MemoryCategoryScope(const MemoryCategoryScope&) = delete;
  MemoryCategoryScope& operator=(const MemoryCategoryScope&) = delete;

 private:
  MemoryCategory previous_;
};
MemoryCategory current_memory_category();

// While one is alive on this thread, every new storage counts as `category` whatever scopes are opened
// inside (the lock-step reference builds whole models and runs whole passes under verification).
class MemoryCategoryOverride {
 public:
  explicit MemoryCategoryOverride(MemoryCategory category);
  ~MemoryCategoryOverride();
  MemoryCategoryOverride(const MemoryCategoryOverride&) = delete;
  MemoryCategoryOverride& operator=(const MemoryCategoryOverride&) = delete;

 private:
  bool had_previous_;
  MemoryCategory previous_;
};
// The category a storage asked for as `category` is counted under (the override's, while one is alive).
MemoryCategory effective_memory_category(MemoryCategory category);

// A per-process budget on a device's counted memory (chapter 07's --mem-limit-mb), 0 for none. An
// allocation that would take the total past it throws OutOfMemory, naming what it needed, the limit,
// what was in use, and the category it was for.
struct OutOfMemory : std::runtime_error {
  using std::runtime_error::runtime_error;
};
void set_memory_limit(Device device, std::int64_t bytes);
std::int64_t memory_limit(Device device);

// Raw counted allocation; Tensor storage goes through these.
void* allocate_bytes(Device device, std::size_t bytes, MemoryCategory category);
void free_bytes(Device device, void* ptr, std::size_t bytes, MemoryCategory category);

// Pinned (page-locked) host memory for staging CUDA tensors through MPI, counted on the CPU as
// communication buffers. Only in builds with the CUDA backend.
void* allocate_pinned_bytes(std::size_t bytes);
void free_pinned_bytes(void* ptr, std::size_t bytes);

// Human-readable size, e.g. "1.50 MiB".
std::string format_bytes(std::int64_t bytes);

}  // namespace course
