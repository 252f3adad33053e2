// What both kinds of checkpoint folder share (chapter 06's one file a step, step_00000040.safetensors,
// and chapter 07's one folder a step, step_00000040/): the step's name, `latest`, a one-line file
// naming the newest complete step (moved only once that step is complete, atomically), and keeping
// only the newest K steps. A crash at any moment leaves the previous step complete and named.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/checkpoint/safetensors.h"  // FileWriter

namespace course::checkpoint {

// Whether a run of `steps` steps writes a checkpoint once `step` steps are done: every `every` steps,
// and at the end (--ckpt-every, chapters 06 and 07).
inline bool writes_checkpoint_at(std::int64_t step, std::int64_t steps, std::int64_t every) {
  return step >= 1 && step <= steps && (step % every == 0 || step == steps);
}

class StepFolder {
 public:
  // `suffix` follows the step's name (".safetensors" for a file a step, "" for a folder a step);
  // `folders`: each step is a folder. `keep`: how many steps to keep (the newest); at least 1.
  StepFolder(std::string dir, int keep, std::string suffix, bool folders);
  const std::string& dir() const { return dir_; }

  std::string path_of(std::int64_t step) const;  // dir/step_00000040 + suffix
  std::string latest_pointer() const;            // dir/latest
  // The step in a name of this folder's kind ("step_00000040" + suffix), or -1 when the name is not one.
  std::int64_t step_in(const std::string& name) const;
  // What `latest` names: nullopt when there is no pointer; an empty string when it is not a regular
  // file (never a pipe to wait on, nor a folder) or holds nothing.
  std::optional<std::string> latest_name() const;
  // The first thing in the way of a checkpoint the run will write (`written(step)`): something at a step's
  // name that is not what the write makes there (a folder, a link or a pipe where a file goes; for a
  // folder a step, anything but a folder, or an index or shard name inside it that is not a regular
  // file). Empty when nothing is: the run may train, knowing every save will find its names free.
  std::string obstruction(const std::function<bool(std::int64_t)>& written) const;
  // Whether the folder holds a pointer or any complete step (a fresh run refuses to overwrite them; what a
  // writer that died left half-written is not a checkpoint).
  bool has_checkpoints() const;
  // How this folder's files reach the disk: the library's write_file_atomically unless given another
  // (chapter 06 gives its own, exercise 06.1). Every file of the folder goes through it, `latest` too.
  void set_writer(FileWriter writer) { writer_ = std::move(writer); }
  const FileWriter& writer() const { return writer_; }
  virtual ~StepFolder() = default;

 protected:
  // Points `latest` at `step` (complete and durable by now), then removes all but the newest `keep`.
  void commit(std::int64_t step) const;
  std::vector<std::pair<std::int64_t, std::string>> steps_on_disk() const;  // newest first
  // Whether the step at `path` was completed (a folder a step is complete once its index is in place).
  virtual bool is_complete(const std::string& path) const { return !path.empty(); }

 private:
  std::string dir_;
  int keep_;
  std::string suffix_;
  bool folders_;
  FileWriter writer_;
};

}  // namespace course::checkpoint
