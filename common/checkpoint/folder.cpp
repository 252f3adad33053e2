// The checkpoint folder: names, the `latest` pointer, retention, and the search for a good checkpoint.
#include "common/checkpoint/folder.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <stdexcept>

namespace course::checkpoint {
namespace fs = std::filesystem;
namespace {
constexpr const char* kPrefix = "step_";
constexpr const char* kSuffix = ".safetensors";
}  // namespace

CheckpointFolder::CheckpointFolder(std::string dir, int keep) : dir_(std::move(dir)), keep_(keep) {
  if (keep < 1) throw std::invalid_argument("CheckpointFolder: keep " + std::to_string(keep) + " must be at least 1");
}

std::string CheckpointFolder::path_for(std::int64_t step) const {
  char name[64];
  std::snprintf(name, sizeof name, "%s%08lld%s", kPrefix, static_cast<long long>(step), kSuffix);
  return (fs::path(dir_) / name).string();
}

std::string CheckpointFolder::latest_pointer() const { return (fs::path(dir_) / "latest").string(); }

std::int64_t CheckpointFolder::step_of(const std::string& file_name) {
  const std::string prefix = kPrefix, suffix = kSuffix;
  if (file_name.size() <= prefix.size() + suffix.size() || file_name.compare(0, prefix.size(), prefix) != 0 ||
      file_name.compare(file_name.size() - suffix.size(), suffix.size(), suffix) != 0)
    return -1;
  const std::string digits = file_name.substr(prefix.size(), file_name.size() - prefix.size() - suffix.size());
  if (digits.empty() || digits.size() > 18 || !std::all_of(digits.begin(), digits.end(), ::isdigit)) return -1;
  return std::stoll(digits);
}

std::vector<std::pair<std::int64_t, std::string>> CheckpointFolder::steps_on_disk() const {
  std::vector<std::pair<std::int64_t, std::string>> found;
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(dir_, error)) {
    const std::int64_t step = step_of(entry.path().filename().string());
    if (step >= 0) found.emplace_back(step, entry.path().string());
  }
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  return found;
}

std::size_t CheckpointFolder::save(std::int64_t step, const NamedTensors& tensors, const Metadata& metadata,
                                   const WriteProgress& progress) const {
  std::error_code error;
  fs::create_directories(dir_, error);
  if (error) throw CheckpointError(dir_ + ": cannot create the checkpoint folder (" + error.message() + ")");
  const std::string path = path_for(step);
  save_safetensors(path, tensors, metadata, progress);
  // The pointer moves only once the checkpoint it names is complete and durable.
  write_file_atomically(latest_pointer(), fs::path(path).filename().string() + "\n");
  const auto on_disk = steps_on_disk();
  for (std::size_t i = static_cast<std::size_t>(keep_); i < on_disk.size(); ++i) fs::remove(on_disk[i].second, error);
  return static_cast<std::size_t>(fs::file_size(path, error));
}

std::vector<std::string> CheckpointFolder::candidates(std::vector<std::string>* problems) const {
  std::vector<std::string> order;
  std::error_code error;
  if (fs::exists(latest_pointer(), error)) {
    std::ifstream in(latest_pointer());
    std::string name;
    std::getline(in, name);
    if (step_of(name) < 0) {
      if (problems) problems->push_back(latest_pointer() + ": does not name a checkpoint ('" + name + "')");
    } else if (!fs::exists(fs::path(dir_) / name, error)) {
      if (problems) problems->push_back(latest_pointer() + ": names " + name + ", which is missing");
    } else {
      order.push_back((fs::path(dir_) / name).string());
    }
  }
  for (const auto& [step, path] : steps_on_disk())
    if (std::find(order.begin(), order.end(), path) == order.end()) order.push_back(path);
  return order;
}

bool CheckpointFolder::has_checkpoints() const {
  std::error_code error;
  return fs::exists(latest_pointer(), error) || !steps_on_disk().empty();
}

std::vector<std::string> CheckpointFolder::remove_partial_writes() const {
  std::vector<std::string> removed;
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(dir_, error)) {
    const std::string name = entry.path().filename().string();
    if (is_partial_write(name) && fs::remove(entry.path(), error)) removed.push_back(name);
  }
  return removed;
}

}  // namespace course::checkpoint
