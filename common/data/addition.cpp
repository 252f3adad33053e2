// The addition task's problems and batches.
#include "common/data/addition.h"

#include <cstdio>
#include <unordered_set>

#include "common/core/errors.h"
#include "common/tensor/random.h"

namespace course::data {

AdditionTask::AdditionTask(int digits, std::int64_t train_size, std::int64_t test_size, std::uint64_t seed)
    : digits_(digits) {
  if (digits < 1 || digits > 9) throw UsageError("digits " + std::to_string(digits) + " must be 1 to 9");
  std::int64_t limit = 1;
  for (int i = 0; i < digits; ++i) limit *= 10;
  const double possible = static_cast<double>(limit) * static_cast<double>(limit);
  if (train_size < 1 || test_size < 0 || static_cast<double>(train_size + test_size) > possible / 2)
    throw UsageError(std::to_string(train_size) + " training and " + std::to_string(test_size) +
                     " test problems: there are only " + std::to_string(static_cast<long long>(possible)) +
                     " problems of " + std::to_string(digits) + " digits (at most half may be used)");
  // Draw distinct problems, the test set first; the training set never repeats one of them.
  std::unordered_set<std::int64_t> taken;
  std::uint64_t counter = 0;
  auto draw = [&](std::int64_t count, std::vector<Problem>& into) {
    while (static_cast<std::int64_t>(into.size()) < count) {
      const auto code =
          static_cast<std::int64_t>(random_bits(seed, counter++) % static_cast<std::uint64_t>(limit * limit));
      if (taken.insert(code).second) into.push_back({code / limit, code % limit});
    }
  };
  draw(test_size, test_);
  draw(train_size, train_);
}

std::string AdditionTask::answer(const Problem& p) const {
  std::string sum = std::to_string(p.a + p.b);
  sum.insert(0, static_cast<std::size_t>(digits_ + 1) - sum.size(), '0');
  return {sum.rbegin(), sum.rend()};
}

std::string AdditionTask::text(const Problem& p) const {
  char prompt[32];
  std::snprintf(prompt, sizeof prompt, "%0*lld+%0*lld=", digits_, static_cast<long long>(p.a), digits_,
                static_cast<long long>(p.b));
  return prompt + answer(p);
}

std::vector<float> AdditionTask::tokens(const std::string& text) const {
  const std::string vocabulary = kVocabulary;
  std::vector<float> ids;
  for (char c : text) ids.push_back(static_cast<float>(vocabulary.find(c)));
  return ids;
}

AdditionTask::Batch AdditionTask::batch(const std::vector<std::int64_t>& indices, Device device) const {
  const std::int64_t length = sequence_length();
  std::vector<float> ids, targets;
  for (std::int64_t i : indices) {
    if (i < 0 || i >= static_cast<std::int64_t>(train_.size()))
      throw std::out_of_range("problem " + std::to_string(i) + " outside the training set");
    const auto all = tokens(text(train_[static_cast<std::size_t>(i)]));  // length + 1 tokens
    ids.insert(ids.end(), all.begin(), all.end() - 1);
    for (std::int64_t j = 0; j < length; ++j)  // input j predicts token j + 1: only the answer's count
      targets.push_back(j + 1 >= prompt_length() ? all[static_cast<std::size_t>(j + 1)] : static_cast<float>(kIgnore));
  }
  const auto b = static_cast<std::int64_t>(indices.size());
  return {Tensor::from_host(ids, {b, length}, device), Tensor::from_host(targets, {b * length}, device)};
}

Tensor AdditionTask::prompts(const std::vector<Problem>& problems, Device device) const {
  std::vector<float> ids;
  for (const auto& p : problems) {
    const auto all = tokens(text(p));
    ids.insert(ids.end(), all.begin(), all.begin() + prompt_length());
  }
  return Tensor::from_host(ids, {static_cast<std::int64_t>(problems.size()), prompt_length()}, device);
}

}  // namespace course::data
