// The index checks of embedding and cross-entropy, made where the indices are: on the CPU an index out of
// range throws at once; on a GPU the kernel records it and the host raises it at its next read of a tensor
// (the loss, which a training step reads anyway), so that the check costs the step no wait.
#pragma once
#include <cstddef>
#include <string>

namespace course {

enum class IndexCheck : int { none = 0, embedding_index = 1, cross_entropy_target = 2, every_target_ignored = 3 };

// What a failed check says (the op's own words, the same on both devices).
std::string index_check_message(IndexCheck check, float value, std::size_t limit);

// A GPU's record of its first failed check, in page-locked host memory that the kernels write directly.
struct IndexCheckRecord {
  int check;  // an IndexCheck; none while every check passed
  float value;
  unsigned long long limit;
};

// After the host has read a tensor from a GPU (the device has finished the work queued before): throws
// std::invalid_argument with the first failed check's message, and clears the record. Nothing otherwise.
void raise_failed_index_check();

}  // namespace course
