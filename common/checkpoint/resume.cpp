// Finding and broadcasting the checkpoint to resume from.
#include "common/checkpoint/resume.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include <cerrno>
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

// One job at a time in a checkpoint folder. After mpirun is killed its ranks run on for a moment (about a
// second) and may still be checkpointing; a restart that started writing meanwhile would share the folder
// with them. So rank 0 holds an exclusive lock on dir/.lock for its whole life (flock: the kernel lets
// go when the process ends, however it ends), and a new job waits for a dying one's lock, for at most
// kFolderLockWaitSeconds, then refuses. The lock is a regular file, opened without following a link (one
// would lock, or create, a file elsewhere) and never skipped: a .lock that cannot be the lock (a folder, a
// link, a pipe) is refused, as a lock that is not taken would let two jobs write one folder. Returns ""
// when this process holds the lock, else why not (the --ckpt-dir error).
constexpr int kFolderLockWaitSeconds = 10;

std::string lock_folder(const std::string& dir) {
  static int held = -1;  // open until the process ends; one folder a process
  if (held >= 0) return "";
  const std::string path = dir + "/.lock";
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0644);
  const int why = errno;
  struct stat what {};
  if (fd < 0 && (why == EACCES || why == EROFS) && ::access(dir.c_str(), W_OK) != 0)
    return "--ckpt-dir: " + dir + " is not writable: checkpoints could not be written into it";
  if (fd < 0 || ::fstat(fd, &what) != 0 || !S_ISREG(what.st_mode)) {
    if (fd >= 0) ::close(fd);
    return "--ckpt-dir: " + path + " is not a lock this job can hold (" +
           (fd < 0 ? std::string(why == ELOOP ? "a link" : why == EISDIR ? "a folder" : std::strerror(why)) : "not a regular file") +
           "), so the folder could not be kept to one job; remove it";
  }
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(kFolderLockWaitSeconds);
  bool waited = false;
  while (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    if (std::chrono::steady_clock::now() >= give_up) {
      ::close(fd);
      return "--ckpt-dir: " + dir + " is in use by another job (it holds " + path + " for " +
             std::to_string(kFolderLockWaitSeconds) + " s and more); stop that job, or choose another folder";
    }
    if (!waited) log("waiting for another job's lock on %s (a job killed a moment ago may still be ending)\n", dir.c_str());
    waited = true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  held = fd;
  return "";
}

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
    } else if (const std::string locked = exists ? lock_folder(dir) : ""; !locked.empty()) {
      error = locked;
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
    } else if (!resume) {  // a fresh run goes ahead: make the folder, lock it, clear what a dead writer left
      fs::create_directories(dir, e);
      if (e || !fs::is_directory(dir)) error = "--ckpt-dir: " + dir + " cannot be created (" + e.message() + ")";
      else if (::access(dir.c_str(), W_OK | X_OK) != 0)
        error = "--ckpt-dir: " + dir + " is not writable: checkpoints could not be written into it";
      else
        error = lock_folder(dir);
      if (error.empty() && exists) remove_logged(remove_partial);  // only once no other job can be writing
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
