// Finding and broadcasting the checkpoint to resume from.
#include "common/checkpoint/resume.h"

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "common/comm/agree.h"
#include "common/core/errors.h"
#include "common/core/log.h"

namespace course::checkpoint {

std::optional<Resumed> load_latest_good(comm::Communicator& group, const CheckpointFolder& folder,
                                        const std::function<void(const std::string&, const Loaded&)>& check,
                                        const std::function<void(const std::string&)>& report, std::string* why) {
  std::optional<Resumed> found;
  std::string summary;  // rank 0: what it found, as JSON for the others
  if (group.rank() == 0) {
    std::vector<std::string> problems;
    const auto candidates = folder.candidates(&problems);
    for (const auto& p : problems) report(p);
    for (std::size_t i = 0; i < candidates.size(); ++i) {
      try {
        Loaded loaded = load_safetensors(candidates[i]);
        check(candidates[i], loaded);
        found = Resumed{candidates[i], std::move(loaded)};
        break;
      } catch (const CheckpointError& e) {
        report(std::string(e.what()) + (i + 1 < candidates.size() ? "; trying an older one" : ""));
        problems.push_back(e.what());
      }
    }
    nlohmann::json s = {{"ok", found.has_value()}};
    if (found) {
      s["path"] = found->path;
      s["metadata"] = found->loaded.metadata;
      s["checksummed"] = found->loaded.checksummed;  // rank 0 verified it; the others read no file
      for (const auto& [name, t] : found->loaded.tensors) s["tensors"].push_back({name, t.shape()});
    } else {
      s["why"] = candidates.empty() && problems.empty()
                     ? "no checkpoint in " + folder.dir()
                     : "no good checkpoint in " + folder.dir() + " (" + std::to_string(problems.size()) +
                           " rejected; the last: " + problems.back() + ")";
    }
    summary = s.dump();
  }
  comm::broadcast_string(group, summary, 0);
  const auto s = nlohmann::json::parse(summary);
  if (!s["ok"].get<bool>()) {
    if (why) *why = s["why"].get<std::string>();
    return std::nullopt;
  }
  if (group.rank() != 0) {
    Resumed r;
    r.path = s["path"].get<std::string>();
    r.loaded.metadata = s["metadata"].get<Metadata>();
    r.loaded.checksummed = s["checksummed"].get<bool>();
    for (const auto& entry : s["tensors"])
      r.loaded.tensors.emplace_back(entry[0].get<std::string>(), Tensor::zeros(entry[1].get<Shape>()));
    found = std::move(r);
  }
  for (auto& [name, t] : found->loaded.tensors) group.broadcast(t, 0);
  return found;
}

namespace {
void remove_logged(const std::function<std::vector<std::string>()>& remove_partial) {
  for (const auto& name : remove_partial())
    log("removed %s: what a checkpoint writer that died left behind\n", name.c_str());
}
}  // namespace

void prepare_checkpoint_folder(comm::Communicator& group, const std::string& dir, bool resume,
                               const std::function<std::vector<std::string>()>& remove_partial,
                               const std::function<bool()>& holds, const std::function<std::string()>& obstruction) {
  namespace fs = std::filesystem;
  std::string error;
  if (group.rank() == 0) {
    // Every reason to refuse first: a run that refuses removes nothing.
    std::error_code e;
    const bool exists = fs::exists(fs::symlink_status(dir, e));
    const fs::path pointer = fs::path(dir) / "latest";
    const auto pointed = fs::symlink_status(pointer, e);
    if (exists && !fs::is_directory(dir, e)) {
      error = "--ckpt-dir: " + dir + " is not a folder";
    } else if (resume && !exists) {
      error = "--resume: the folder " + dir + " does not exist";
    } else if (exists && fs::exists(pointed) && !fs::is_regular_file(pointed)) {
      error = "--ckpt-dir: " + pointer.string() + " is not a regular file (the pointer to the newest checkpoint "
              "is); remove it";
    } else if (!resume && exists && holds()) {
      error = "--ckpt-dir: " + dir + " already holds checkpoints; pass --resume to continue from them, or choose "
              "another folder";
    } else if (const std::string in_the_way = exists ? obstruction() : ""; !in_the_way.empty()) {
      error = "--ckpt-dir: " + in_the_way + " is in the way of a checkpoint this run will write (a folder, a link "
              "or a pipe where the checkpoint goes); remove it";
    } else if (exists && ::access(dir.c_str(), W_OK | X_OK) != 0) {
      error = "--ckpt-dir: " + dir + " is not writable: checkpoints could not be written into it";
    } else if (!resume) {  // a fresh run goes ahead: clear what a dead writer left, or make the folder
      if (exists) remove_logged(remove_partial);
      fs::create_directories(dir, e);
      if (e || !fs::is_directory(dir)) error = "--ckpt-dir: " + dir + " cannot be created (" + e.message() + ")";
      else if (::access(dir.c_str(), W_OK | X_OK) != 0)
        error = "--ckpt-dir: " + dir + " is not writable: checkpoints could not be written into it";
    }
  }
  comm::broadcast_string(group, error, 0);
  if (!error.empty()) throw UsageError(error);
}

void remove_dead_writes(comm::Communicator& group, const std::function<std::vector<std::string>()>& remove_partial) {
  if (group.rank() == 0) remove_logged(remove_partial);
  group.barrier();
}

}  // namespace course::checkpoint
