// Sharded checkpoints: one file per rank, the index as the commit, and consolidation.
#include "common/checkpoint/sharded.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "common/comm/agree.h"         // broadcast_string, first_error

namespace course::checkpoint {
namespace fs = std::filesystem;
namespace {

constexpr const char* kIndex = "index.json";
constexpr const char* kShardedFormat = "course-sharded-2";  // 2: each shard's checksum in the index


// Every rank learns whether any failed; all then throw the lowest failing rank's message.
void agree(comm::Communicator& group, const std::string& my_error) {
  const comm::FirstError first = comm::first_error(group, my_error);
  if (first.any()) throw CheckpointError(first.message);
}

// A checksum (16 hex digits, 64 bits) as four 16-bit values, each exact in a float, for a collective.
std::vector<float> checksum_as_floats(const std::string& text) {
  const std::uint64_t value = text.empty() ? 0 : std::stoull(text, nullptr, 16);
  return {static_cast<float>(value & 0xffff), static_cast<float>((value >> 16) & 0xffff),
          static_cast<float>((value >> 32) & 0xffff), static_cast<float>(value >> 48)};
}
std::string checksum_from_floats(const float* v) {
  std::uint64_t value = 0;
  for (int i = 3; i >= 0; --i) value = (value << 16) | static_cast<std::uint64_t>(v[i]);
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(value));
  return text;
}

// A shard read whole and checked, then against the index: the checksum the index recorded for it. A
// shard of another run or another step, or an index from another run, differs there.
Loaded load_listed_shard(const std::string& path, const nlohmann::json& entry) {
  Loaded shard = load_safetensors(path);
  const std::string listed = entry.value("checksum", "");
  if (!shard.checksummed || shard.checksum != listed)
    throw CheckpointError(path + ": is not the shard its index lists (checksum " +
                          (shard.checksummed ? shard.checksum : std::string("none")) + ", the index records " +
                          (listed.empty() ? std::string("none") : listed) +
                          "): a shard or an index from another run or another step");
  return shard;
}

// Shard r of `shards` as an index read from disk lists it: under the name the writer gives it (never a
// path out of the step's folder, "../../elsewhere") and with a whole number of bytes; the file's path.
std::string listed_path(const std::string& step_dir, const nlohmann::json& entry, int r, int shards) {
  const std::string index_path = (fs::path(step_dir) / kIndex).string();
  const std::string expected = ShardedFolder::shard_name(r, shards);
  if (!entry.is_object() || !entry.contains("file") || !entry.at("file").is_string() ||
      entry.at("file").get<std::string>() != expected)
    throw CheckpointError(index_path + ": lists shard " + std::to_string(r) + " as " +
                          (entry.is_object() && entry.contains("file") ? entry.at("file").dump() : std::string("nothing")) +
                          ", not " + expected);
  if (!entry.contains("bytes") || !entry.at("bytes").is_number_unsigned())
    throw CheckpointError(index_path + ": lists shard " + std::to_string(r) + "'s size as " +
                          (entry.contains("bytes") ? entry.at("bytes").dump() : std::string("nothing")) +
                          ", not a number of bytes");
  return (fs::path(step_dir) / expected).string();
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw CheckpointError(path + ": cannot be read");
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

std::string ShardedFolder::shard_name(int shard, int shards) {
  char name[64];
  std::snprintf(name, sizeof name, "shard_%05d_of_%05d.safetensors", shard, shards);
  return name;
}

std::size_t ShardedFolder::save(comm::Communicator& group, std::int64_t step, int shards, const NamedTensors& mine,
                                const Metadata& metadata, const nlohmann::json& layout,
                                const WriteProgress& progress) const {
  const std::string folder = step_dir(step);
  std::string error;
  if (group.rank() == 0) {
    std::error_code e;
    fs::create_directories(folder, e);
    if (e) error = folder + ": cannot be created (" + e.message() + ")";
  }
  comm::broadcast_string(group, error, 0);
  if (!error.empty()) throw CheckpointError(error);

  std::size_t bytes = 0;
  std::string checksum;
  try {
    if (!mine.empty()) {
      Metadata m = metadata;
      m["step"] = std::to_string(step);
      m["shard"] = std::to_string(group.rank());
      m["shards"] = std::to_string(shards);
      const std::string path = (fs::path(folder) / shard_name(group.rank(), shards)).string();
      checksum = save_safetensors(path, mine, m, progress);
      bytes = static_cast<std::size_t>(fs::file_size(path));
    }
  } catch (const std::exception& e) {
    error = e.what();
  }
  agree(group, error);  // every shard is in place (or every rank throws)
  // Rank 0 records every shard's checksum in the index.
  Tensor mine_sum = Tensor::from_host(checksum_as_floats(checksum), {4});
  Tensor sums = Tensor::zeros({4 * static_cast<std::int64_t>(group.size())});
  group.all_gather(mine_sum, sums);
  const auto sum_values = sums.to_host();

  if (group.rank() == 0) {
    try {
      nlohmann::json files = nlohmann::json::array();
      for (int r = 0; r < shards; ++r) {
        const fs::path path = fs::path(folder) / shard_name(r, shards);
        std::error_code e;
        const auto size = fs::file_size(path, e);
        if (e) throw CheckpointError(path.string() + ": missing after every rank wrote its shard (is " + dir() +
                                     " on storage every rank shares?)");
        files.push_back({{"file", shard_name(r, shards)}, {"bytes", size},
                         {"checksum", checksum_from_floats(sum_values.data() + 4 * r)}});
      }
      nlohmann::json index = {{"format", kShardedFormat}, {"step", step}, {"world_size", group.size()}, {"shards", files},
                              {"metadata", metadata}, {"layout", layout}};
      write_file_atomically((fs::path(folder) / kIndex).string(), index.dump(1) + "\n");  // the commit
      commit(step);
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  comm::broadcast_string(group, error, 0);
  if (!error.empty()) throw CheckpointError(error);
  return bytes;
}

std::optional<std::int64_t> ShardedFolder::latest_complete() const {
  std::error_code error;
  if (const auto name = latest_name()) {  // never a pipe to wait on, nor a folder
    const std::int64_t step = step_in(*name);
    if (step >= 0 && fs::exists(fs::path(dir()) / *name / kIndex, error)) return step;
  }
  for (const auto& [step, path] : steps_on_disk())
    if (fs::exists(fs::path(path) / kIndex, error)) return step;
  return std::nullopt;
}

std::vector<std::int64_t> ShardedFolder::complete_steps() const {
  std::vector<std::int64_t> steps;
  if (const auto latest = latest_complete()) steps.push_back(*latest);
  std::error_code error;
  for (const auto& [step, path] : steps_on_disk())
    if (fs::exists(fs::path(path) / kIndex, error) && std::find(steps.begin(), steps.end(), step) == steps.end())
      steps.push_back(step);
  return steps;
}

bool ShardedFolder::is_complete(const std::string& path) const {
  std::error_code error;
  return fs::exists(fs::path(path) / kIndex, error);
}

std::vector<std::string> ShardedFolder::remove_incomplete() const {
  std::vector<std::string> removed;
  std::error_code error;
  auto remove_temporaries = [&](const fs::path& folder) {
    for (const auto& entry : fs::directory_iterator(folder, error))
      if (is_partial_write(entry.path().filename().string()) && fs::remove(entry.path(), error))
        removed.push_back(entry.path().string());
  };
  remove_temporaries(dir());
  for (const auto& [step, path] : steps_on_disk()) {
    if (!is_complete(path)) {
      if (fs::remove_all(path, error) > 0) removed.push_back(path);
    } else {
      remove_temporaries(path);
    }
  }
  return removed;
}

nlohmann::json ShardedFolder::index(std::int64_t step) const {
  const std::string path = (fs::path(step_dir(step)) / kIndex).string();
  nlohmann::json index;
  try {
    index = nlohmann::json::parse(read_text(path));
  } catch (const nlohmann::json::exception& e) {
    throw CheckpointError(path + ": not valid JSON (" + e.what() + ")");
  }
  if (!index.is_object() || index.value("format", "") != kShardedFormat || !index.contains("shards") ||
      !index.contains("layout") || !index.contains("metadata") || !index.contains("world_size"))
    throw CheckpointError(path + ": not a sharded checkpoint index (" + kShardedFormat + ")");
  return index;
}

Loaded ShardedFolder::load_shard(comm::Communicator& group, std::int64_t step) const {
  Loaded loaded;
  std::string error;
  try {
    const nlohmann::json idx = index(step);
    const auto& files = idx.at("shards");
    const auto& world = idx.at("world_size");
    if (!world.is_number_unsigned() || world.get<std::uint64_t>() != static_cast<std::uint64_t>(group.size()))
      throw CheckpointError(step_dir(step) + ": was written by " + world.dump() + " ranks; this run has " +
                            std::to_string(group.size()) + " (a sharded checkpoint resumes at the world size that wrote it)");
    if (!files.is_array() || files.empty() || files.size() > static_cast<std::size_t>(group.size()))
      throw CheckpointError(step_dir(step) + "/" + kIndex + ": lists " + files.dump().substr(0, 60) + " as the shards of " +
                            std::to_string(group.size()) + " ranks");
    if (group.rank() < static_cast<int>(files.size())) {
      const auto& entry = files.at(static_cast<std::size_t>(group.rank()));
      // The writer names each shard by the layout's count of them (checked against the files further on).
      const auto& layout = idx.at("layout");
      const int shards = layout.is_object() && layout.contains("shards") && layout.at("shards").is_number_unsigned()
                             ? static_cast<int>(std::min<std::uint64_t>(layout.at("shards").get<std::uint64_t>(), 1 << 20))
                             : static_cast<int>(files.size());
      const std::string path = listed_path(step_dir(step), entry, group.rank(), shards);
      std::error_code e;
      if (fs::file_size(path, e) != entry.at("bytes").get<std::uintmax_t>() || e)
        throw CheckpointError(path + ": is not the file the index lists (" + std::to_string(entry.at("bytes").get<std::uintmax_t>()) +
                              " bytes)");
      loaded = load_listed_shard(path, entry);
      if (loaded.metadata["step"] != std::to_string(step) || loaded.metadata["shard"] != std::to_string(group.rank()))
        throw CheckpointError(path + ": holds shard " + loaded.metadata["shard"] + " of step " + loaded.metadata["step"] +
                              ", not shard " + std::to_string(group.rank()) + " of step " + std::to_string(step));
    }
  } catch (const std::exception& e) {
    error = e.what();
  }
  agree(group, error);
  return loaded;
}

void consolidate(const std::string& step_dir, const std::string& out, const Metadata& metadata) {
  const std::string index_path = (fs::path(step_dir) / kIndex).string();
  if (!fs::exists(index_path))
    throw CheckpointError(step_dir + ": has no " + kIndex + " (not a sharded checkpoint, or one whose writing never finished)");
  nlohmann::json index;
  try {
    index = nlohmann::json::parse(read_text(index_path));
  } catch (const nlohmann::json::exception& e) {
    throw CheckpointError(index_path + ": not valid JSON (" + e.what() + ")");
  }
  try {
    const auto& layout = index.at("layout");
    const auto shards = layout.at("shards").get<int>();
    const auto shard_len = layout.at("shard").get<std::int64_t>();
    const auto padded = layout.at("padded").get<std::int64_t>();
    // An index is read from disk: every number it gives is checked before it places a value.
    const auto bad = [&](const std::string& what) { throw CheckpointError(index_path + ": " + what); };
    if (shards < 1 || shard_len < 0 || padded < 0 || static_cast<std::int64_t>(shards) * shard_len < padded ||
        padded > (std::int64_t{1} << 40) || index.at("shards").size() != static_cast<std::size_t>(shards))
      bad("its layout's sizes do not fit together (" + std::to_string(shards) + " shards of " +
          std::to_string(shard_len) + " for " + std::to_string(padded) + " elements, " +
          std::to_string(index.at("shards").size()) + " files)");
    for (const auto& unit : layout.at("units")) {
      const auto part = unit.at("part").get<std::int64_t>(), offset = unit.at("offset").get<std::int64_t>();
      const auto shard_offset = unit.at("shard_offset").get<std::int64_t>();
      if (part < 0 || offset < 0 || shard_offset < 0 || shard_offset + part > shard_len ||
          offset + static_cast<std::int64_t>(shards) * part > padded)
        bad("a unit of its layout lies outside the buffers (offset " + std::to_string(offset) + ", part " +
            std::to_string(part) + ", shard offset " + std::to_string(shard_offset) + ")");
    }
    std::vector<float> flat(static_cast<std::size_t>(padded));
    for (int r = 0; r < shards; ++r) {
      const auto& entry = index.at("shards").at(static_cast<std::size_t>(r));
      const std::string path = listed_path(step_dir, entry, r, shards);
      const Loaded shard = load_listed_shard(path, entry);
      const Tensor* param = nullptr;
      for (const auto& [name, t] : shard.tensors)
        if (name == "param") param = &t;
      if (!param || param->numel() != shard_len)
        throw CheckpointError(path + ": has no 'param' tensor of " + std::to_string(shard_len) + " elements");
      const auto values = param->to_host();
      for (const auto& unit : layout.at("units")) {  // rank r's part of each unit sits at r x part in the unit
        const auto part = unit.at("part").get<std::int64_t>(), offset = unit.at("offset").get<std::int64_t>();
        std::copy_n(values.begin() + unit.at("shard_offset").get<std::int64_t>(), part,
                    flat.begin() + offset + r * part);
      }
    }
    NamedTensors tensors;
    for (const auto& p : layout.at("parameters")) {
      const auto shape = p.at("shape").get<std::vector<std::int64_t>>();
      std::int64_t numel = 1;
      for (auto d : shape) {
        if (d < 0 || (d > 0 && numel > padded / d)) bad("parameter '" + p.at("name").get<std::string>() + "' has a shape larger than the buffer");
        numel *= d;
      }
      const auto at = p.at("offset").get<std::int64_t>();
      if (at < 0 || at + numel > padded)
        bad("parameter '" + p.at("name").get<std::string>() + "' lies outside the buffer (offset " + std::to_string(at) + ")");
      const auto begin = flat.begin() + at;
      tensors.emplace_back(p.at("name").get<std::string>(), Tensor::from_host(std::vector<float>(begin, begin + numel), shape));
    }
    save_safetensors(out, tensors, metadata);
  } catch (const nlohmann::json::exception& e) {
    throw CheckpointError(index_path + ": its layout is incomplete (" + e.what() + ")");
  }
}

}  // namespace course::checkpoint
