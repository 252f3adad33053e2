// Saving a module's parameters.
#include "common/checkpoint/parameters.h"

#include <unistd.h>

#include <filesystem>

#include "common/core/errors.h"

namespace course::checkpoint {

void save_parameters(const std::string& path, const nn::Module& module, const Metadata& metadata) {
  NamedTensors tensors;
  for (const auto& [name, p] : module.named_parameters()) tensors.emplace_back(name, p);
  save_safetensors(path, tensors, metadata);
}

void check_writable(const std::string& path) {
  const std::filesystem::path target(path);
  const std::filesystem::path folder = target.has_parent_path() ? target.parent_path() : std::filesystem::path(".");
  std::error_code error;
  if (target.filename().empty() || std::filesystem::is_directory(target, error))
    throw UsageError(path + ": is a folder, not a file name");
  if (!std::filesystem::is_directory(folder, error) || ::access(folder.c_str(), W_OK) != 0)
    throw UsageError(path + ": its folder " + folder.string() + " does not exist or is not writable");
}

}  // namespace course::checkpoint
