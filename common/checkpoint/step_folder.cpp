// Step names, the `latest` pointer and retention, for both kinds of checkpoint folder.
#include "common/checkpoint/step_folder.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <stdexcept>

#include "common/checkpoint/safetensors.h"  // write_file_atomically

namespace course::checkpoint {
namespace fs = std::filesystem;
namespace {
constexpr const char* kPrefix = "step_";
}  // namespace

StepFolder::StepFolder(std::string dir, int keep, std::string suffix, bool folders)
    : dir_(std::move(dir)), keep_(keep), suffix_(std::move(suffix)), folders_(folders) {
  if (keep < 1) throw std::invalid_argument("checkpoint folder: keep " + std::to_string(keep) + " must be at least 1");
}

std::string StepFolder::path_of(std::int64_t step) const {
  char name[32];
  std::snprintf(name, sizeof name, "%s%08lld", kPrefix, static_cast<long long>(step));
  return (fs::path(dir_) / (name + suffix_)).string();
}

std::string StepFolder::latest_pointer() const { return (fs::path(dir_) / "latest").string(); }

std::int64_t StepFolder::step_in(const std::string& name) const {
  const std::string prefix = kPrefix;
  if (name.size() <= prefix.size() + suffix_.size() || name.compare(0, prefix.size(), prefix) != 0 ||
      name.compare(name.size() - suffix_.size(), suffix_.size(), suffix_) != 0)
    return -1;
  const std::string digits = name.substr(prefix.size(), name.size() - prefix.size() - suffix_.size());
  if (digits.empty() || digits.size() > 18 || !std::all_of(digits.begin(), digits.end(), ::isdigit)) return -1;
  return std::stoll(digits);
}

std::optional<std::string> StepFolder::latest_name() const {
  std::error_code error;
  const fs::path pointer = latest_pointer();
  const auto status = fs::symlink_status(pointer, error);
  if (!fs::exists(status)) return std::nullopt;
  std::string name;
  if (fs::is_regular_file(status)) {
    std::ifstream in(pointer);
    std::getline(in, name);
  }
  return name;
}

std::vector<std::pair<std::int64_t, std::string>> StepFolder::steps_on_disk() const {
  std::vector<std::pair<std::int64_t, std::string>> found;
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(dir_, error)) {
    const std::int64_t step = step_in(entry.path().filename().string());
    if (step >= 0 && (!folders_ || entry.is_directory(error))) found.emplace_back(step, entry.path().string());
  }
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  return found;
}

std::string StepFolder::obstruction(const std::function<bool(std::int64_t)>& written) const {
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(dir_, error)) {
    const std::int64_t step = step_in(entry.path().filename().string());
    if (step < 0 || !written(step)) continue;
    const auto status = fs::symlink_status(entry.path(), error);
    if (!folders_) {
      if (!fs::is_regular_file(status)) return entry.path().string();
      continue;
    }
    if (!fs::is_directory(status)) return entry.path().string();
    for (const auto& inner : fs::directory_iterator(entry.path(), error)) {
      const std::string name = inner.path().filename().string();
      if ((name == "index.json" || name.rfind("shard_", 0) == 0) && !fs::is_regular_file(fs::symlink_status(inner.path(), error)))
        return inner.path().string();
    }
  }
  return {};
}

bool StepFolder::has_checkpoints() const {
  std::error_code error;
  if (fs::exists(fs::symlink_status(latest_pointer(), error))) return true;
  for (const auto& [step, path] : steps_on_disk())
    if (is_complete(path)) return true;
  return false;
}

void StepFolder::commit(std::int64_t step) const {
  const std::string pointer = fs::path(path_of(step)).filename().string() + "\n";
  if (writer_) writer_(latest_pointer(), {pointer}, {});
  else write_file_atomically(latest_pointer(), pointer);
  const auto on_disk = steps_on_disk();
  std::error_code error;
  for (std::size_t i = static_cast<std::size_t>(keep_); i < on_disk.size(); ++i) fs::remove_all(on_disk[i].second, error);
}

}  // namespace course::checkpoint
