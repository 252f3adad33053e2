// Saving a module's parameters.
#include "common/checkpoint/parameters.h"

#include <climits>

#include <unistd.h>

#include <filesystem>
#include <map>

#include "common/autograd/autograd.h"
#include "common/core/errors.h"
#include "common/core/output_folder.h"

namespace course::checkpoint {

void save_parameters(const std::string& path, const nn::Module& module, const Metadata& metadata) {
  NamedTensors tensors;
  for (const auto& [name, p] : module.named_parameters()) tensors.emplace_back(name, p);
  save_safetensors(path, tensors, metadata);
}

void load_parameters(const std::string& path, nn::Module& module) {
  const Loaded loaded = load_safetensors(path);
  std::map<std::string, const Tensor*> by_name;
  for (const auto& [name, t] : loaded.tensors) by_name[name] = &t;
  auto shape_text = [](const Shape& shape) {
    std::string s = "[";
    for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
    return s + "]";
  };
  for (auto& [name, p] : module.named_parameters()) {
    const auto it = by_name.find(name);
    if (it == by_name.end()) throw CheckpointError(path + ": has no parameter '" + name + "'");
    if (it->second->shape() != p.shape())
      throw CheckpointError(path + ": '" + name + "' has shape " + shape_text(it->second->shape()) +
                            "; this model's is " + shape_text(p.shape()));
    by_name.erase(it);
  }
  if (!by_name.empty()) throw CheckpointError(path + ": holds '" + by_name.begin()->first + "', which this model lacks");
  autograd::NoGradGuard no_grad;
  for (auto& [name, p] : module.named_parameters())
    for (const auto& [n, t] : loaded.tensors)
      if (n == name) Tensor(p).copy_from(t);
}

void check_writable(const std::string& path) {
  const std::filesystem::path target(path);
  const std::filesystem::path folder = target.has_parent_path() ? target.parent_path() : std::filesystem::path(".");
  std::error_code error;
  if (target.filename().empty() || std::filesystem::is_directory(target, error))
    throw UsageError(path + ": is a folder, not a file name");
  // What is there must be a regular file, to be replaced (never a device, a pipe or a link).
  const auto status = std::filesystem::symlink_status(target, error);
  if (!error && std::filesystem::exists(status) && !std::filesystem::is_regular_file(status))
    throw UsageError(path + ": is not a regular file (a device, a pipe or a link); choose a file name");
  // The atomic write's temporary, ".NAME.tmp.PID", must fit the file system's limit on a name.
  if (target.filename().string().size() + 20 > static_cast<std::size_t>(NAME_MAX))
    throw UsageError(path + ": the file name is longer than the " + std::to_string(NAME_MAX - 20) + " characters it may have");
  if (const std::string problem = output_folder_problem(folder); !problem.empty()) throw UsageError(path + ": " + problem);
}

}  // namespace course::checkpoint
