// Multi-tensor apply: one element-wise update over a list of tensors in one launch instead of one launch
// per tensor (NVIDIA apex's multi_tensor_apply; torch.optim's foreach and fused AdamW). GPT-2 124M's
// AdamW is 148 tensors: one launch for all of them. The tensors are cut into chunks of kMultiTensorChunk
// elements and a GPU block takes a chunk; the list travels in the kernel's parameters (so a captured
// CUDA Graph replays it), kMultiTensorLaunch tensors at a time. The CPU walks the same chunks, so the
// chunking that the GPU relies on is tested where there is no GPU (optim_test).
#pragma once
#include <algorithm>
#include <cstddef>
#include <vector>

#include "common/kernels/rounded.h"

namespace course::math {

constexpr std::size_t kMultiTensorChunk = 8192;  // elements a block updates (32 a thread, with 256 threads)
constexpr int kMultiTensorLaunch = 256;          // tensors a launch takes: 256 x 48 bytes of table, under 32 KB

// Where each tensor's chunks begin in a launch's run of chunks: first[t], and first[count] = the total.
struct MultiTensorChunks {
  std::size_t first[kMultiTensorLaunch + 1];
  int count = 0;
};

// The chunks of tensors of `sizes[0..count)` elements (count <= kMultiTensorLaunch).
inline MultiTensorChunks multi_tensor_chunks(const std::size_t* sizes, int count) {
  MultiTensorChunks c;
  c.count = count;
  c.first[0] = 0;
  for (int t = 0; t < count; ++t) c.first[t + 1] = c.first[t] + (sizes[t] + kMultiTensorChunk - 1) / kMultiTensorChunk;
  return c;
}

// The tensor that chunk `chunk` (< first[count]) belongs to: the last t with first[t] <= chunk, which
// skips empty tensors (their first equals the next one's). A binary search, log2(256) = 8 steps.
COURSE_HOST_DEVICE inline int multi_tensor_owner(const MultiTensorChunks& c, std::size_t chunk) {
  int lo = 0, hi = c.count - 1;  // first[lo] <= chunk always holds
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (c.first[mid] <= chunk) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

// Chunk `chunk`'s tensor and its elements [begin, end) there; T has the tensor's length as `n`.
struct ChunkRange {
  int tensor;
  std::size_t begin, end;
};
template <class T>
COURSE_HOST_DEVICE inline ChunkRange multi_tensor_range(const MultiTensorChunks& c, const T* tensors, std::size_t chunk) {
  const int t = multi_tensor_owner(c, chunk);
  const std::size_t begin = (chunk - c.first[t]) * kMultiTensorChunk, end = begin + kMultiTensorChunk;
  return {t, begin, end < tensors[t].n ? end : tensors[t].n};
}

// launch(tensors, count, chunks) for the list kMultiTensorLaunch tensors at a time, in order.
template <class T, class Launch>
void for_each_multi_tensor_launch(const std::vector<T>& list, Launch launch) {
  for (std::size_t from = 0; from < list.size(); from += kMultiTensorLaunch) {
    const int count = static_cast<int>(std::min<std::size_t>(kMultiTensorLaunch, list.size() - from));
    std::size_t sizes[kMultiTensorLaunch];
    for (int t = 0; t < count; ++t) sizes[t] = list[from + t].n;
    launch(list.data() + from, count, multi_tensor_chunks(sizes, count));
  }
}

}  // namespace course::math
