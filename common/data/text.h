// Character-level text from a file: the vocabulary is the file's distinct bytes, the last
// val_fraction of the text is held out, and training sample i is the window of block_size + 1
// characters starting at i (inputs are its first block_size, targets its last block_size).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "common/tensor/tensor.h"

namespace course::data {

class CharText {
 public:
  // Throws UsageError naming `path` when it is missing, unreadable, empty, or too short to give one
  // training window of block_size + 1 characters and one validation window.
  CharText(const std::string& path, std::int64_t block_size, double val_fraction);

  std::int64_t vocab_size() const { return static_cast<std::int64_t>(vocabulary_.size()); }
  std::int64_t block_size() const { return block_; }
  std::int64_t train_windows() const { return static_cast<std::int64_t>(train_.size()) - block_; }
  std::int64_t validation_windows() const { return static_cast<std::int64_t>(validation_.size()) - block_; }

  struct Batch {
    Tensor ids, targets;  // [B, block_size], [B * block_size]
  };
  Batch batch(const std::vector<std::int64_t>& windows, Device device, bool validation = false) const;
  std::string decode(const std::vector<float>& ids) const;
  std::vector<float> encode(const std::string& text) const;  // characters outside the vocabulary are refused
  const std::string& validation_text() const { return validation_; }

 private:
  std::string vocabulary_, train_, validation_;
  std::int64_t block_;
};

}  // namespace course::data
