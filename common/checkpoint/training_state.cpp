// Training checkpoints: what is saved, and the checks before anything is loaded.
#include "common/checkpoint/training_state.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/core/fnv.h"

namespace course::checkpoint {
namespace {

constexpr const char* kTrainingStateFormat = "course-training-checkpoint-1";
constexpr const char* kOptimizerPrefix = "optimizer.";
constexpr const char* kStateDigest = "state_digest";

// The flag that sets a key of a run's configuration (training_checkpoint.h: RunIdentity::config), as
// the user wrote it: n_layer is --n-layer, schedule_steps (the GPT's learning-rate schedule) --steps.
std::string flag_of(const std::string& key) {
  if (key == "schedule_steps") return "--steps";
  std::string flag = "--" + key;
  for (char& c : flag)
    if (c == '_') c = '-';
  return flag;
}

// The first setting in which two configurations differ, as "--flag: ours differs from the checkpoint's
// theirs"; a key one lacks is its default ("precision" is fp32). The data's description follows from the
// other settings, so it is named only when nothing else differs. Empty when the texts are not JSON.
std::string first_difference(const nlohmann::ordered_json& saved, const nlohmann::ordered_json& ours,
                             const std::string& data_key) {
  std::string data_difference;
  auto value = [](const nlohmann::ordered_json& j, const std::string& key) {
    if (!j.contains(key)) return key == "precision" ? std::string("fp32") : std::string("(none)");
    return j.at(key).is_string() ? j.at(key).get<std::string>() : j.at(key).dump();
  };
  std::vector<std::string> keys;  // in the order the run writes them: the model first
  for (const auto& [key, v] : ours.items()) keys.push_back(key);
  for (const auto& [key, v] : saved.items())
    if (!ours.contains(key)) keys.push_back(key);
  for (const std::string& key : keys) {
    if (saved.contains(key) && ours.contains(key) && saved.at(key).is_object() && ours.at(key).is_object()) {
      const std::string inner = first_difference(saved.at(key), ours.at(key), data_key);
      if (!inner.empty()) return inner;
      continue;
    }
    if (value(saved, key) == value(ours, key)) continue;
    const std::string line = flag_of(key) + ": " + value(ours, key) + " differs from the checkpoint's " + value(saved, key);
    if (key == data_key) data_difference = line;
    else return line;
  }
  return data_difference;
}

std::string config_difference(const std::string& saved, const std::string& ours) {
  const auto a = nlohmann::ordered_json::parse(saved, nullptr, false), b = nlohmann::ordered_json::parse(ours, nullptr, false);
  const std::string named = a.is_object() && b.is_object() ? first_difference(a, b, "data") : "";
  return named.empty() ? saved + "; this run's is " + ours : named;
}

std::int64_t integer(const std::string& path, const Metadata& metadata, const std::string& key) {
  auto it = metadata.find(key);
  if (it == metadata.end()) throw CheckpointError(path, "metadata lacks '" + key + "': not a training checkpoint of this course");
  const std::string& text = it->second;
  std::size_t used = 0;
  long long value = 0;
  try {
    value = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size() || value < 0)
    throw CheckpointError(path, "metadata '" + key + "' is '" + text + "', not a non-negative integer");
  return value;
}

const std::string& text(const std::string& path, const Metadata& metadata, const std::string& key) {
  auto it = metadata.find(key);
  if (it == metadata.end()) throw CheckpointError(path, "metadata lacks '" + key + "': not a training checkpoint of this course");
  return it->second;
}

// A digest as 16 hexadecimal digits.
std::string hex(std::uint64_t hash) {
  char out[17];
  std::snprintf(out, sizeof out, "%016llx", static_cast<unsigned long long>(hash));
  return out;
}

}  // namespace

std::string config_hash(const std::string& model_config) {
  return hex(fnv1a(kFnvOffset, model_config.data(), model_config.size()));
}

NamedTensors training_tensors(const nn::Module& model, const optim::Optimizer& optimizer) {
  NamedTensors tensors;
  for (const auto& [name, p] : model.named_parameters()) tensors.emplace_back(name, p);
  for (const auto& [name, t] : optimizer.state()) tensors.emplace_back(kOptimizerPrefix + name, t);
  return tensors;
}

std::string state_digest(const NamedTensors& tensors, const Metadata& metadata) {
  std::uint64_t hash = kFnvOffset;
  const auto add_text = [&hash](const std::string& text) { hash = fnv1a(hash, text.c_str(), text.size() + 1); };  // with its end
  std::map<std::string, const Tensor*> by_name;
  for (const auto& [name, t] : tensors) by_name[name] = &t;
  for (const auto& [name, t] : by_name) {
    add_text(name);
    const std::vector<float> values = t->to_host();
    hash = fnv1a(hash, values.data(), values.size() * sizeof(float));
  }
  for (const auto& [key, value] : metadata)  // a std::map: in the order of the keys
    if (key != kStateDigest && key != "checksum") add_text(key), add_text(value);
  return hex(hash);
}

Metadata training_metadata(const TrainingState& s, const std::string& model_config, const nn::Module& model,
                           const optim::Optimizer& optimizer) {
  Metadata m{{"format", kTrainingStateFormat},
          {"step", std::to_string(s.step)},
          {"samples_seen", std::to_string(s.samples_seen)},
          {"epoch", std::to_string(s.epoch)},
          {"seed", std::to_string(s.seed)},
          {"global_batch", std::to_string(s.global_batch)},
          {"world_size", std::to_string(s.world_size)},
          {"world_history", s.world_history},
          {"model_config", model_config},
          {"model_config_hash", config_hash(model_config)},
          {"optimizer", optimizer.name()},
          {"optimizer_step", std::to_string(optimizer.steps_taken())},
          {"lr", std::to_string(optimizer.lr())}};
  put_loss_scale(m, s.loss_scale);
  m[kStateDigest] = state_digest(training_tensors(model, optimizer), m);
  return m;
}

void put_loss_scale(Metadata& m, const optim::GradScalerState& state) {
  if (!(state.scale > 0.0f)) return;  // fp16 runs only; the scale in hexadecimal, exactly
  char scale[40];
  std::snprintf(scale, sizeof scale, "%a", static_cast<double>(state.scale));
  m["loss_scale"] = scale;
  m["loss_scale_growth_tracker"] = std::to_string(state.growth_tracker);
  m["loss_scale_skipped_steps"] = std::to_string(state.skipped);
}

optim::GradScalerState loss_scale_of(const std::string& path, const Metadata& m) {
  if (!m.count("loss_scale")) return {};
  const std::string& scale = m.at("loss_scale");
  char* end = nullptr;
  const double value = std::strtod(scale.c_str(), &end);
  if (scale.empty() || *end != '\0' || !(value > 0) || !std::isfinite(value))
    throw CheckpointError(path, "metadata 'loss_scale' is '" + scale + "', not a positive number");
  return {static_cast<float>(value), integer(path, m, "loss_scale_growth_tracker"),
          integer(path, m, "loss_scale_skipped_steps")};
}

TrainingState check_training_checkpoint(const std::string& path, const Loaded& loaded, const nn::Module& model,
                                        const std::string& model_config, const optim::Optimizer& optimizer) {
  const Metadata& m = loaded.metadata;
  // Every checkpoint this course writes carries a checksum: one without is damaged (or another writer's).
  if (!loaded.checksummed) throw CheckpointError(path, "has no checksum: damaged, or not a checkpoint of this course");
  if (text(path, m, "format") != kTrainingStateFormat) throw CheckpointError(path, "format '" + m.at("format") + "' is not " + kTrainingStateFormat);
  // The hash covers the configuration text, so a damaged configuration is caught as well as another model.
  if (text(path, m, "model_config_hash") != config_hash(text(path, m, "model_config")))
    throw CheckpointError(path, "model_config does not match its hash");
  if (m.at("model_config_hash") != config_hash(model_config))
    throw CheckpointError(path, "was saved by another run: " + config_difference(m.at("model_config"), model_config));
  if (text(path, m, "optimizer") != optimizer.name())
    throw CheckpointError(path, "holds " + m.at("optimizer") + " state; this run uses " + optimizer.name());
  TrainingState s;
  s.step = integer(path, m, "step");
  s.samples_seen = integer(path, m, "samples_seen");
  s.epoch = integer(path, m, "epoch");
  s.seed = static_cast<std::uint64_t>(integer(path, m, "seed"));
  s.global_batch = integer(path, m, "global_batch");
  s.world_size = static_cast<int>(integer(path, m, "world_size"));
  s.world_history = text(path, m, "world_history");
  s.loss_scale = loss_scale_of(path, m);
  // The optimizer stepped at every step but those the loss scaler skipped (fp16's overflows).
  if (integer(path, m, "optimizer_step") + s.loss_scale.skipped != s.step)
    throw CheckpointError(path, "optimizer_step " + m.at("optimizer_step") + " and " + std::to_string(s.loss_scale.skipped) +
                   " skipped steps do not add up to step " + m.at("step"));
  if (s.world_size < 1) throw CheckpointError(path, "world_size is 0");

  std::map<std::string, Shape> saved;
  for (const auto& [name, t] : loaded.tensors) saved[name] = t.shape();
  std::size_t expected = 0;
  auto expect = [&](const std::string& name, const Shape& shape) {
    ++expected;
    auto it = saved.find(name);
    if (it == saved.end()) throw CheckpointError(path, "lacks tensor '" + name + "'");
    if (it->second != shape)
      throw CheckpointError(path,
           "tensor '" + name + "' has shape " + shape_string(it->second) + "; this model's is " + shape_string(shape));
  };
  for (const auto& [name, p] : model.named_parameters()) expect(name, p.shape());
  // The optimizer's buffers have their parameters' shapes; before its first step it has none yet.
  if (s.step > 0) {
    const auto params = optimizer.params();
    for (const auto& [name, t] : loaded.tensors) {
      if (name.rfind(kOptimizerPrefix, 0) != 0) continue;
      const std::string rest = name.substr(std::string(kOptimizerPrefix).size());
      const std::size_t dot = rest.find('.');
      std::size_t index = params.size();
      try {
        index = std::stoul(rest.substr(0, dot));
      } catch (const std::exception&) {
      }
      if (dot == std::string::npos || index >= params.size()) throw CheckpointError(path, "unexpected optimizer tensor '" + name + "'");
      expect(name, params[index].shape());
    }
  }
  if (expected != loaded.tensors.size())
    throw CheckpointError(path, std::to_string(loaded.tensors.size() - expected) + " tensors that this model does not have");
  if (state_digest(loaded.tensors, m) != text(path, m, kStateDigest))
    throw CheckpointError(path, "its values do not give the digest of the training state it was saved from (" +
                                    m.at(kStateDigest) + "): its values were written wrong (a checksum covers only the bytes written)");
  return s;
}

void restore(const std::string& path, const Loaded& loaded, nn::Module& model, optim::Optimizer& optimizer) {
  std::map<std::string, const Tensor*> by_name;
  for (const auto& [name, t] : loaded.tensors) by_name[name] = &t;
  for (auto& [name, p] : model.named_parameters()) p.copy_from(*by_name.at(name));
  std::vector<std::pair<std::string, Tensor>> state;
  const std::string prefix = kOptimizerPrefix;
  for (const auto& [name, t] : loaded.tensors)
    if (name.rfind(prefix, 0) == 0) state.emplace_back(name.substr(prefix.size()), t);
  optimizer.load_state(state, std::stol(loaded.metadata.at("optimizer_step")));
  if (state_digest(training_tensors(model, optimizer), loaded.metadata) != text(path, loaded.metadata, kStateDigest))
    throw CheckpointError(path, "restored, the run's parameters and optimizer state do not give the checkpoint's "
                                "digest (" + loaded.metadata.at(kStateDigest) + "): the restore went wrong");
}

}  // namespace course::checkpoint
