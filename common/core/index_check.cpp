// The index checks' messages, and the host's look at a GPU's record of them.
#include "common/core/index_check.h"

#include <stdexcept>

#include "common/core/cuda_runtime.h"

namespace course {

std::string index_check_message(IndexCheck check, float value, std::size_t limit) {
  switch (check) {
    case IndexCheck::embedding_index:
      return "embedding: index " + std::to_string(value) + " is not a row below " + std::to_string(limit);
    case IndexCheck::cross_entropy_target:
      return "cross_entropy: target " + std::to_string(value) + " is not a class index below " + std::to_string(limit);
    case IndexCheck::every_target_ignored:
      return "cross_entropy: every target is ignored";
    case IndexCheck::none:
      break;
  }
  return "an index check failed";
}

void raise_failed_index_check() {
#if COURSE_HAVE_CUDA
  auto* record = static_cast<volatile IndexCheckRecord*>(cuda::index_check_record_host());
  if (!record || record->check == static_cast<int>(IndexCheck::none)) return;
  const auto check = static_cast<IndexCheck>(record->check);
  const float value = record->value;
  const auto limit = static_cast<std::size_t>(record->limit);
  record->check = static_cast<int>(IndexCheck::none);
  throw std::invalid_argument(index_check_message(check, value, limit));
#endif
}

}  // namespace course
