// Resuming: rank 0 finds the newest good checkpoint and broadcasts it, so ranks on machines without
// shared storage resume too, and a damaged file is named and skipped, never loaded.
#pragma once
#include <functional>
#include <optional>
#include <string>

#include "common/checkpoint/folder.h"
#include "common/comm/communicator.h"

namespace course::checkpoint {

struct Resumed {
  std::string path;  // the file it came from (as rank 0 saw it)
  Loaded loaded;     // on the CPU, on every rank
};

// Rank 0 reads the folder's candidates best first (CheckpointFolder::candidates), validating each
// with load_safetensors and then `check` (which throws CheckpointError to reject one); each rejection
// goes to `report` as one line. The first good checkpoint is broadcast over `group`. Returns nullopt
// on every rank when none is good, with `why` saying what was found. Collective over `group`.
std::optional<Resumed> load_latest_good(comm::Communicator& group, const CheckpointFolder& folder,
                                        const std::function<void(const std::string&, const Loaded&)>& check,
                                        const std::function<void(const std::string&)>& report, std::string* why);

// At start-up, before any training, the same for every rank of `group` (rank 0 looks, the others learn
// the outcome; a problem is a UsageError naming the flag, thrown on every rank): a fresh run refuses a
// folder that already `holds` checkpoints, --resume one that does not exist; either refuses a folder it
// cannot write into, rather than failing at the first checkpoint, and a `latest` pointer that is not a
// regular file. Only then does a fresh run remove what writers that died left behind (`remove_partial`,
// each logged: temporaries, never a complete checkpoint) and create its folder: a run that refuses has
// removed nothing. A resumed run removes them once it has resumed (remove_dead_writes). Chapters 06, 07.
// `obstruction` names the first thing in the way of a checkpoint the run will write (StepFolder::obstruction),
// so that the run refuses now instead of failing at that checkpoint, after training up to it.
void prepare_checkpoint_folder(comm::Communicator& group, const std::string& dir, bool resume,
                               const std::function<std::vector<std::string>()>& remove_partial,
                               const std::function<bool()>& holds, const std::function<std::string()>& obstruction);

// After a successful resume: rank 0 removes and logs what writers that died left behind. Collective.
void remove_dead_writes(comm::Communicator& group, const std::function<std::vector<std::string>()>& remove_partial);

}  // namespace course::checkpoint
