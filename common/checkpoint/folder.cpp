// The checkpoint folder: names, the `latest` pointer, retention, and the search for a good checkpoint.
#include "common/checkpoint/folder.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <stdexcept>

namespace course::checkpoint {
namespace fs = std::filesystem;

CheckpointFolder::CheckpointFolder(std::string dir, int keep) : StepFolder(std::move(dir), keep, ".safetensors", false) {}

std::int64_t CheckpointFolder::step_of(const std::string& file_name) {
  static const CheckpointFolder names("", 1);
  return names.step_in(file_name);
}

std::size_t CheckpointFolder::save(std::int64_t step, const NamedTensors& tensors, const Metadata& metadata,
                                   const WriteProgress& progress) const {
  std::error_code error;
  fs::create_directories(dir(), error);
  if (error) throw CheckpointError(dir() + ": cannot create the checkpoint folder (" + error.message() + ")");
  const std::string path = path_for(step);
  save_safetensors(path, tensors, metadata, progress, writer());
  commit(step);  // the pointer moves only once the checkpoint it names is complete and durable
  return static_cast<std::size_t>(fs::file_size(path, error));
}

std::vector<std::string> CheckpointFolder::candidates(std::vector<std::string>* problems) const {
  std::vector<std::string> order;
  std::error_code error;
  if (const auto name = latest_name()) {
    if (step_in(*name) < 0) {
      if (problems) problems->push_back(latest_pointer() + ": does not name a checkpoint ('" + *name + "')");
    } else if (!fs::exists(fs::path(dir()) / *name, error)) {
      if (problems) problems->push_back(latest_pointer() + ": names " + *name + ", which is missing");
    } else {
      order.push_back((fs::path(dir()) / *name).string());
    }
  }
  for (const auto& [step, path] : steps_on_disk())
    if (std::find(order.begin(), order.end(), path) == order.end()) order.push_back(path);
  return order;
}

std::vector<std::string> CheckpointFolder::remove_partial_writes() const {
  std::vector<std::string> removed;
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(dir(), error)) {
    const std::string name = entry.path().filename().string();
    if (is_partial_write(name) && fs::remove(entry.path(), error)) removed.push_back(name);
  }
  return removed;
}

}  // namespace course::checkpoint
