// Saving and resuming a ZeRO run.
#include "common/parallel/zero_checkpoint.h"

#include "common/core/errors.h"

namespace course::parallel {

std::size_t save_zero_checkpoint(const checkpoint::ShardedFolder& folder, comm::Communicator& group,
                                 const ZeroOptimizer& zero, const nn::Module& model, std::int64_t step,
                                 const checkpoint::Metadata& settings) {
  checkpoint::Metadata metadata = settings;
  metadata["optimizer_step"] = std::to_string(zero.steps_taken());
  metadata["world_size"] = std::to_string(group.size());
  return folder.save(group, step, zero.layout().shards(), zero.state_shard(), metadata,
                     checkpoint::describe_layout(zero.layout(), model));
}

std::int64_t resume_zero_checkpoint(const checkpoint::ShardedFolder& folder, comm::Communicator& group,
                                    ZeroOptimizer& zero, const checkpoint::Metadata& settings) {
  // Every rank reads the same index on the shared folder, so they agree on the step and the settings.
  const auto step = folder.latest_complete();
  if (!step) throw UsageError("--resume: " + folder.dir() + " holds no complete sharded checkpoint");
  nlohmann::json index;
  try {
    index = folder.index(*step);
  } catch (const checkpoint::CheckpointError& e) {
    throw UsageError(std::string("--resume: ") + e.what());
  }
  const auto saved = index.at("metadata").get<checkpoint::Metadata>();
  for (const auto& [flag, value] : settings) {
    const auto it = saved.find(flag);
    const std::string theirs = it == saved.end() ? "(none)" : it->second;
    if (theirs != value)
      throw UsageError("--" + flag + ": " + value + " differs from the checkpoint's " + theirs + " (" +
                       folder.step_dir(*step) + ")");
  }
  checkpoint::Loaded loaded;
  try {
    loaded = folder.load_shard(group, *step);
  } catch (const checkpoint::CheckpointError& e) {
    throw UsageError(std::string("--resume: ") + e.what());
  }
  zero.load_state_shard(loaded.tensors, std::stol(saved.at("optimizer_step")));
  return *step;
}

}  // namespace course::parallel
