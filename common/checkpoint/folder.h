// A folder of training checkpoints, one file a step: step_00000040.safetensors, ..., and `latest`
// naming the newest complete one (step_folder.h, shared with chapter 07's sharded folders). Every file
// is written atomically (safetensors.h), and `latest` moves only after its checkpoint is in place, so a
// crash at any moment leaves the previous checkpoint and a pointer to a complete file. Only rank 0
// touches the folder (chapter 06).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "common/checkpoint/safetensors.h"
#include "common/checkpoint/step_folder.h"

namespace course::checkpoint {

class CheckpointFolder : public StepFolder {
 public:
  // `keep`: how many checkpoints to keep (the newest); at least 1.
  CheckpointFolder(std::string dir, int keep);

  std::string path_for(std::int64_t step) const { return path_of(step); }  // dir/step_00000040.safetensors

  // Writes the checkpoint of `step`, points `latest` at it, then deletes all but the newest `keep`.
  // Returns the bytes written. Creates the folder if it is missing.
  std::size_t save(std::int64_t step, const NamedTensors& tensors, const Metadata& metadata,
                   const WriteProgress& progress = {}) const;

  // The checkpoints to try, best first: the one `latest` names, then every other from the newest step
  // down (the fallbacks when it is damaged). A pointer that is unreadable or names a missing file is
  // described in `problems`, and the scan goes on without it.
  std::vector<std::string> candidates(std::vector<std::string>* problems = nullptr) const;
  // Deletes the temporary files of writers that died mid-write; returns their names.
  std::vector<std::string> remove_partial_writes() const;
  // The step in a checkpoint's file name, or -1 when the name is not one.
  static std::int64_t step_of(const std::string& file_name);
};

}  // namespace course::checkpoint
