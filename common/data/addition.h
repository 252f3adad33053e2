// Integer addition as character strings: a task whose success is measurable (exact-match accuracy on
// held-out problems). A problem of D digits is written "123+045=" followed by the sum's D + 1 digits
// reversed ("8610" for 168), so the model produces the lowest digit first and can carry as on paper
// (the trick of minGPT's adder). The model is trained to predict only the answer's digits; every other
// position's target is ignore_index.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "common/tensor/tensor.h"

namespace course::data {

class AdditionTask {
 public:
  static constexpr const char* kVocabulary = "0123456789+=";  // token i is kVocabulary[i]
  static constexpr int kIgnore = -100;

  struct Problem {
    std::int64_t a, b;
  };
  // Disjoint sets of distinct problems, drawn by a counter-based generator from `seed`. Throws
  // UsageError when there are not that many problems of `digits` digits, or digits is outside 1..9.
  AdditionTask(int digits, std::int64_t train_size, std::int64_t test_size, std::uint64_t seed);

  int digits() const { return digits_; }
  std::int64_t vocab_size() const { return 12; }
  std::int64_t sequence_length() const { return 3 * digits_ + 2; }  // the model's input length
  std::int64_t prompt_length() const { return 2 * digits_ + 2; }    // "123+045="
  const std::vector<Problem>& train() const { return train_; }
  const std::vector<Problem>& test() const { return test_; }

  std::string text(const Problem& p) const;  // "123+045=8610"
  std::vector<float> tokens(const std::string& text) const;

  struct Batch {
    Tensor ids;      // [B, sequence_length()]
    Tensor targets;  // [B * sequence_length()], kIgnore but at the answer's positions
  };
  Batch batch(const std::vector<std::int64_t>& train_indices, Device device) const;

  // The prompts of `problems` as [N, prompt_length()], and the answers they should produce.
  Tensor prompts(const std::vector<Problem>& problems, Device device) const;
  std::string answer(const Problem& p) const;  // "8610"

 private:
  int digits_;
  std::vector<Problem> train_, test_;
};

}  // namespace course::data
