// Counted allocation for CPU and CUDA storage.
#include "common/core/memory.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <new>
#include <unordered_set>

#include "common/core/cpu_allocator.h"
#include "common/core/cuda_runtime.h"

namespace course {
namespace {

struct Counters {
  std::mutex mutex;
  MemoryStats stats[2];
  std::int64_t limit[2] = {0, 0};
};
Counters& counters() {
  static Counters* instance = new Counters;  // outlives static tensors freed at exit
  return *instance;
}
// ZeRO-Offload's host memory is page-locked once the process computes on a GPU, so that its copies to
// and from the device are DMA transfers at the link's rate (DeepSpeed pins its offloaded buffers too);
// a CPU-only run keeps ordinary memory. The pinned blocks are remembered, to be released as they came.
std::atomic<bool> g_gpu_in_use{false};
std::unordered_set<void*>& pinned_offloaded() {
  static auto* blocks = new std::unordered_set<void*>;  // under counters().mutex
  return *blocks;
}
thread_local MemoryCategory t_category = MemoryCategory::activations;
thread_local bool t_overridden = false;
thread_local MemoryCategory t_override = MemoryCategory::verification;

void count(Device device, MemoryCategory category, std::int64_t delta) {
  std::lock_guard<std::mutex> lock(counters().mutex);
  MemoryStats& s = counters().stats[static_cast<int>(device)];
  auto c = static_cast<std::size_t>(category);
  s.current[c] += delta;
  if (s.current[c] > s.peak[c]) s.peak[c] = s.current[c];
  if (!counts_on_device(category)) return;  // apart from the run's totals
  s.current_total += delta;
  if (s.current_total > s.peak_total) s.peak_total = s.current_total;
}

}  // namespace

const char* memory_category_name(MemoryCategory category) {
  switch (category) {
    case MemoryCategory::parameters: return "parameters";
    case MemoryCategory::gradients: return "gradients";
    case MemoryCategory::optimizer_state: return "optimizer_state";
    case MemoryCategory::activations: return "activations";
    case MemoryCategory::communication: return "communication";
    case MemoryCategory::offloaded: return "offloaded";
    case MemoryCategory::verification: return "verification";
    default: return "unknown";
  }
}

MemoryStats memory_stats(Device device) {
  std::lock_guard<std::mutex> lock(counters().mutex);
  return counters().stats[static_cast<int>(device)];
}

void reset_peak_memory(Device device) {
  std::lock_guard<std::mutex> lock(counters().mutex);
  MemoryStats& s = counters().stats[static_cast<int>(device)];
  s.peak = s.current;
  s.peak_total = s.current_total;
}

MemoryCategoryScope::MemoryCategoryScope(MemoryCategory category) : previous_(t_category) {
  t_category = category;
}
MemoryCategoryScope::~MemoryCategoryScope() { t_category = previous_; }
MemoryCategory current_memory_category() { return t_category; }

MemoryCategoryOverride::MemoryCategoryOverride(MemoryCategory category)
    : had_previous_(t_overridden), previous_(t_override) {
  t_overridden = true;
  t_override = category;
}
MemoryCategoryOverride::~MemoryCategoryOverride() {
  t_overridden = had_previous_;
  t_override = previous_;
}
MemoryCategory effective_memory_category(MemoryCategory category) { return t_overridden ? t_override : category; }

void set_memory_limit(Device device, std::int64_t bytes) {
  std::lock_guard<std::mutex> lock(counters().mutex);
  counters().limit[static_cast<int>(device)] = bytes;
}

std::int64_t memory_limit(Device device) {
  std::lock_guard<std::mutex> lock(counters().mutex);
  return counters().limit[static_cast<int>(device)];
}

void* allocate_bytes(Device device, std::size_t bytes, MemoryCategory category) {
  if (bytes == 0) return nullptr;
  {
    std::lock_guard<std::mutex> lock(counters().mutex);
    const std::int64_t limit = counters().limit[static_cast<int>(device)];
    const std::int64_t in_use = counters().stats[static_cast<int>(device)].current_total;
    if (limit > 0 && counts_on_device(category) && in_use + static_cast<std::int64_t>(bytes) > limit)
      throw OutOfMemory("out of memory: needs " + format_bytes(static_cast<std::int64_t>(bytes)) + ", limit " +
                        format_bytes(limit) + " (" + format_bytes(in_use) + " in use), category " +
                        memory_category_name(category));
  }
  void* ptr = nullptr;
  if (device == Device::cpu) {
#if COURSE_HAVE_CUDA
    if (category == MemoryCategory::offloaded && g_gpu_in_use.load()) {
      ptr = cuda::allocate_pinned(bytes);
      std::lock_guard<std::mutex> lock(counters().mutex);
      pinned_offloaded().insert(ptr);
    }
#endif
    if (!ptr) ptr = cpu_allocator::allocate(bytes);
  } else {
#if COURSE_HAVE_CUDA
    g_gpu_in_use.store(true);
    ptr = cuda::allocate(bytes);
#else
    throw std::runtime_error("CUDA allocation requested in a build without the CUDA backend");
#endif
  }
  count(device, category, static_cast<std::int64_t>(bytes));
  return ptr;
}

void free_bytes(Device device, void* ptr, std::size_t bytes, MemoryCategory category) {
  if (!ptr) return;
  if (device == Device::cpu) {
    bool pinned = false;
    if (category == MemoryCategory::offloaded) {
      std::lock_guard<std::mutex> lock(counters().mutex);
      pinned = pinned_offloaded().erase(ptr) > 0;
    }
#if COURSE_HAVE_CUDA
    if (pinned) cuda::release_pinned(ptr, bytes);
#endif
    if (!pinned) cpu_allocator::release(ptr, bytes);
  } else {
#if COURSE_HAVE_CUDA
    cuda::release(ptr, bytes);
#endif
  }
  count(device, category, -static_cast<std::int64_t>(bytes));
}

void* allocate_pinned_bytes(std::size_t bytes) {
  if (bytes == 0) return nullptr;
#if COURSE_HAVE_CUDA
  void* ptr = cuda::allocate_pinned(bytes);
  count(Device::cpu, MemoryCategory::communication, static_cast<std::int64_t>(bytes));
  return ptr;
#else
  throw std::runtime_error("pinned memory requested in a build without the CUDA backend");
#endif
}

void free_pinned_bytes(void* ptr, std::size_t bytes) {
  if (!ptr) return;
#if COURSE_HAVE_CUDA
  cuda::release_pinned(ptr, bytes);
#endif
  count(Device::cpu, MemoryCategory::communication, -static_cast<std::int64_t>(bytes));
}

std::string format_bytes(std::int64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024.0 && unit < 3) {
    value /= 1024.0;
    ++unit;
  }
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, unit == 0 ? "%.0f %s" : "%.2f %s", value, units[unit]);
  return buffer;
}

}  // namespace course
