// Character-level text.
#include "common/data/text.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "common/core/errors.h"

namespace course::data {

CharText::CharText(const std::string& path, std::int64_t block_size, double val_fraction) : block_(block_size) {
  std::error_code error;
  if (!std::filesystem::exists(path, error)) throw UsageError(path + ": no such file");
  if (std::filesystem::is_directory(path, error)) throw UsageError(path + ": is a folder, not a text file");
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  if (!in || !(text << in.rdbuf())) {
    if (std::filesystem::file_size(path, error) == 0 && !error) throw UsageError(path + ": is empty");
    throw UsageError(path + ": cannot be read");
  }
  const std::string all = text.str();
  if (all.empty()) throw UsageError(path + ": is empty");
  if (!(val_fraction > 0.0 && val_fraction < 1.0))
    throw UsageError("validation fraction " + std::to_string(val_fraction) + " must be between 0 and 1");
  const auto split = static_cast<std::size_t>(static_cast<double>(all.size()) * (1.0 - val_fraction));
  train_ = all.substr(0, split);
  validation_ = all.substr(split);
  const auto needed = static_cast<std::size_t>(block_size + 1);
  if (train_.size() < needed || validation_.size() < needed)
    throw UsageError(path + ": " + std::to_string(all.size()) + " characters are too few for windows of " +
                     std::to_string(needed) + " in both the training and the validation part");
  std::set<char> distinct(all.begin(), all.end());
  vocabulary_.assign(distinct.begin(), distinct.end());
}

std::vector<float> CharText::encode(const std::string& text) const {
  std::vector<float> ids;
  for (char c : text) {
    const auto at = vocabulary_.find(c);
    if (at == std::string::npos) throw std::invalid_argument("character outside the vocabulary");
    ids.push_back(static_cast<float>(at));
  }
  return ids;
}

std::string CharText::decode(const std::vector<float>& ids) const {
  std::string text;
  for (float id : ids) text += vocabulary_[static_cast<std::size_t>(id)];
  return text;
}

CharText::Batch CharText::batch(const std::vector<std::int64_t>& windows, Device device, bool validation) const {
  const std::string& source = validation ? validation_ : train_;
  const std::int64_t count = validation ? validation_windows() : train_windows();
  std::vector<float> ids, targets;
  for (std::int64_t w : windows) {
    if (w < 0 || w >= count) throw std::out_of_range("window " + std::to_string(w) + " outside the text");
    const auto window = encode(source.substr(static_cast<std::size_t>(w), static_cast<std::size_t>(block_ + 1)));
    ids.insert(ids.end(), window.begin(), window.end() - 1);
    targets.insert(targets.end(), window.begin() + 1, window.end());
  }
  const auto b = static_cast<std::int64_t>(windows.size());
  return {Tensor::from_host(ids, {b, block_}, device), Tensor::from_host(targets, {b * block_}, device)};
}

}  // namespace course::data
