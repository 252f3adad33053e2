// Sharded checkpoints (the idea of torch.distributed.checkpoint and DeepSpeed's ZeRO checkpoints): under
// ZeRO no rank holds the whole training state, so each rank writes its own part, in chapter 06's format:
//   dir/step_00000020/shard_00001_of_00004.safetensors  one per rank holding state, each written atomically
//   dir/step_00000020/index.json                         rank 0, after every shard is in place: the run's
//                                                        metadata, each shard's checksum, and the layout
//   dir/latest                                           "step_00000020", once the index is in place
// The index is the commit: a step folder without one (a job that died while saving) is never loaded.
// The layout (each parameter's name, shape and place in the flat units) lets consolidate() put the
// shards back together into one ordinary safetensors file, in any process, without the job that wrote
// them.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/checkpoint/safetensors.h"
#include "common/checkpoint/step_folder.h"
#include "common/comm/communicator.h"
#include "common/nn/module.h"

namespace course::checkpoint {

// One folder a step (step_folder.h: the step's name, `latest`, keeping the newest K, as chapter 06's).
class ShardedFolder : public StepFolder {
 public:
  ShardedFolder(std::string dir, int keep) : StepFolder(std::move(dir), keep, "", true) {}
  std::string step_dir(std::int64_t step) const { return path_of(step); }  // dir/step_00000020
  static std::string shard_name(int shard, int shards);  // shard_00001_of_00004.safetensors

  // Collective over `group`. Each rank with a non-empty `mine` writes it as shard `group.rank()` of
  // `shards`; once every rank has, rank 0 writes the index (with `metadata` and `layout`) and points
  // `latest` at the step, then keeps only the newest `keep` steps. Returns the bytes this rank wrote.
  std::size_t save(comm::Communicator& group, std::int64_t step, int shards, const NamedTensors& mine,
                   const Metadata& metadata, const nlohmann::json& layout, const WriteProgress& progress = {}) const;

  // The newest step whose index is in place, the one `latest` names first; nullopt when none is.
  std::optional<std::int64_t> latest_complete() const;
  // Every step whose index is in place, the one `latest` names first, then newest first: what a resume
  // tries in turn when a newer one turns out damaged.
  std::vector<std::int64_t> complete_steps() const;
  // Removes what writers that died left: the step folders without an index (killed before the commit),
  // and the temporaries of an atomic write (".latest.tmp.PID", a shard's ".tmp" file in a complete
  // step), as chapter 06 removes its ".tmp" files; returns what it removed.
  std::vector<std::string> remove_incomplete() const;
  // The index of `step`. Throws CheckpointError naming the file.
  nlohmann::json index(std::int64_t step) const;

  // Collective: this rank's shard of `step` (empty when the index lists none for it), checked against
  // the index's checksum. Every rank learns whether all succeeded: if any failed, all throw
  // CheckpointError with the first rank's message, so none hangs waiting for the others.
  Loaded load_shard(comm::Communicator& group, std::int64_t step) const;

 protected:
  bool is_complete(const std::string& path) const override;
};

// Puts the shards of the checkpoint in `step_dir` back together and writes every parameter, under its
// own name and shape, to `out` (an ordinary safetensors file that chapter 04's --init, the peer script
// and any framework can load), with `metadata`. Throws CheckpointError naming the file at fault.
void consolidate(const std::string& step_dir, const std::string& out, const Metadata& metadata = {});

}  // namespace course::checkpoint
