// Saving and resuming a ZeRO run.
#include "common/parallel/zero_checkpoint.h"

#include "common/checkpoint/training_state.h"
#include "common/core/errors.h"
#include "common/core/log.h"

namespace course::parallel {

nlohmann::json describe_layout(const parallel::FlatLayout& layout, const nn::Module& model) {
  nlohmann::json units = nlohmann::json::array(), params = nlohmann::json::array();
  for (const auto& u : layout.units())
    units.push_back({{"offset", u.offset}, {"padded", u.padded}, {"part", u.part}, {"shard_offset", u.shard_offset}});
  const auto named = model.named_parameters();
  for (std::size_t i = 0; i < named.size(); ++i)
    params.push_back({{"name", named[i].first}, {"shape", named[i].second.shape()}, {"offset", layout.offset_of(i)},
                      {"unit", layout.unit_of(i)}});
  return {{"shards", layout.shards()}, {"padded", layout.padded()}, {"shard", layout.shard()}, {"units", units},
          {"parameters", params}};
}


std::size_t save_zero_checkpoint(const checkpoint::ShardedFolder& folder, comm::Communicator& group,
                                 const ZeroOptimizer& zero, const nn::Module& model, std::int64_t step,
                                 const checkpoint::Metadata& settings, const checkpoint::WriteProgress& progress) {
  checkpoint::Metadata metadata = settings;
  metadata["optimizer_step"] = std::to_string(zero.steps_taken());
  checkpoint::put_loss_scale(metadata, zero.scaler_state());  // fp16: decides which of the next steps skip
  metadata["world_size"] = std::to_string(group.size());
  return folder.save(group, step, zero.layout().shards(), zero.state_shard(), metadata,
                     describe_layout(zero.layout(), model), progress);
}

std::int64_t resume_zero_checkpoint(const checkpoint::ShardedFolder& folder, comm::Communicator& group,
                                    ZeroOptimizer& zero, const checkpoint::Metadata& settings) {
  // Every rank reads the same indexes on the shared folder, so they agree on the steps and the settings.
  const auto steps = folder.complete_steps();
  if (steps.empty()) throw UsageError("--resume: " + folder.dir() + " holds no complete sharded checkpoint");
  std::string rejected;
  for (const std::int64_t step : steps) {
    nlohmann::json index;
    checkpoint::Loaded loaded;
    try {
      index = folder.index(step);
      const auto saved = index.at("metadata").get<checkpoint::Metadata>();
      for (const auto& [flag, value] : settings) {
        const auto it = saved.find(flag);
        const std::string theirs = it == saved.end() ? "(none)" : it->second;
        if (theirs != value)
          throw UsageError("--" + flag + ": " + value + " differs from the checkpoint's " + theirs + " (" +
                           folder.step_dir(step) + ")");
      }
      const auto scaler = checkpoint::loss_scale_of(folder.step_dir(step), saved);
      const long optimizer_step = std::stol(saved.at("optimizer_step"));
      if (optimizer_step + scaler.skipped != step)  // the optimizer stepped at every step fp16 did not skip
        throw checkpoint::CheckpointError(folder.step_dir(step) + ": optimizer_step " + saved.at("optimizer_step") +
                                          " and " + std::to_string(scaler.skipped) + " skipped steps do not add up to step " +
                                          std::to_string(step));
      const std::size_t listed = index.at("shards").size();  // every rank reads the same index: all agree
      if (index.at("world_size").get<int>() == group.size() &&  // another world size: load_shard says so
          listed != static_cast<std::size_t>(zero.layout().shards()))
        throw checkpoint::CheckpointError(folder.step_dir(step) + "/index.json: lists " + std::to_string(listed) +
                                          " shards where this run's layout has " +
                                          std::to_string(zero.layout().shards()));
      loaded = folder.load_shard(group, step);  // every rank throws alike when any shard is damaged
      zero.load_state_shard(loaded.tensors, optimizer_step);
      zero.load_scaler_state(scaler);
      return step;
    } catch (const checkpoint::CheckpointError& e) {  // damaged: the next older one, as chapter 06 does
      log("rejected %s%s\n", e.what(), step == steps.back() ? "" : "; trying an older one");
      rejected = e.what();
    } catch (const nlohmann::json::exception& e) {
      log("rejected %s: its index is incomplete (%s)%s\n", folder.step_dir(step).c_str(), e.what(),
          step == steps.back() ? "" : "; trying an older one");
      rejected = e.what();
    }
  }
  throw UsageError("--resume: no good sharded checkpoint in " + folder.dir() + " (" + std::to_string(steps.size()) +
                   " rejected; the last: " + rejected + ")");
}

}  // namespace course::parallel
