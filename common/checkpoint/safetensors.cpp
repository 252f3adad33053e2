// The safetensors writer and the validating reader.
#include "common/checkpoint/safetensors.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace course::checkpoint {
namespace {

// The header is JSON, so it cannot be larger than this without being something else.
constexpr std::uint64_t kMaxHeaderBytes = 100u << 20;

// FNV-1a over the header's content (every entry and metadata value but the checksum itself, as
// canonical JSON) and the data section: a flipped byte anywhere that still parses is caught.
std::string checksum_of(nlohmann::json header, const char* data, std::size_t n) {
  if (header.contains("__metadata__")) header["__metadata__"].erase("checksum");
  const std::string canonical = header.dump();
  std::uint64_t hash = 0xcbf29ce484222325ULL;
  for (char c : canonical) hash = (hash ^ static_cast<unsigned char>(c)) * 0x100000001b3ULL;
  for (std::size_t i = 0; i < n; ++i) hash = (hash ^ static_cast<unsigned char>(data[i])) * 0x100000001b3ULL;
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(hash));
  return text;
}

[[noreturn]] void fail(const std::string& path, const std::string& what) { throw CheckpointError(path + ": " + what); }

void fsync_or_fail(int fd, const std::string& path) {
  if (::fsync(fd) != 0) fail(path, std::string("fsync failed (") + std::strerror(errno) + ")");
}

}  // namespace

bool is_partial_write(const std::string& file_name) {
  return file_name.size() > 1 && file_name[0] == '.' && file_name.find(".tmp.") != std::string::npos;
}

void write_file_atomically(const std::string& path, const std::string& bytes, const WriteProgress& progress) {
  namespace fs = std::filesystem;
  const fs::path target(path);
  const fs::path folder = target.has_parent_path() ? target.parent_path() : fs::path(".");
  std::string hidden = std::string(".") + target.filename().string();  // ".name.tmp.PID", beside the target
  hidden += ".tmp.";
  hidden += std::to_string(::getpid());
  const std::string temporary = (folder / hidden).string();
  int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) fail(path, std::string("cannot write into its folder (") + std::strerror(errno) + ")");
  // Large writes in chunks: progress is reported between them, and the kernel streams them to disk.
  const std::size_t chunk = std::clamp<std::size_t>(bytes.size() / 8, 4096, std::size_t{8} << 20);
  std::size_t written = 0;
  while (written < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + written, std::min(chunk, bytes.size() - written));
    if (n < 0) {
      if (errno == EINTR) continue;
      const std::string why = std::strerror(errno);
      ::close(fd);
      ::unlink(temporary.c_str());
      fail(path, "write failed (" + why + ")");
    }
    written += static_cast<std::size_t>(n);
    if (progress) progress(written, bytes.size());
  }
  fsync_or_fail(fd, temporary);
  ::close(fd);
  if (std::rename(temporary.c_str(), path.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    ::unlink(temporary.c_str());
    fail(path, "rename failed (" + why + ")");
  }
  // The rename is durable only once the folder's entry is on disk.
  int dir = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY);
  if (dir >= 0) {
    fsync_or_fail(dir, folder.string());
    ::close(dir);
  }
}

void save_safetensors(const std::string& path, const NamedTensors& tensors, const Metadata& metadata,
                      const WriteProgress& progress) {
  std::string data;
  nlohmann::json header = nlohmann::json::object();
  for (const auto& [name, tensor] : tensors) {
    if (name == "__metadata__" || header.contains(name))
      fail(path, "tensor name '" + name + "' is reserved or repeated");
    auto values = tensor.to_host();
    const std::size_t begin = data.size();
    data.append(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));  // x86: little-endian
    header[name] = {{"dtype", "F32"}, {"shape", tensor.shape()}, {"data_offsets", {begin, data.size()}}};
  }
  nlohmann::json meta = nlohmann::json::object();
  for (const auto& [key, value] : metadata) meta[key] = value;
  header["__metadata__"] = meta;
  header["__metadata__"]["checksum"] = checksum_of(header, data.data(), data.size());
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the data section starts 8-byte aligned
  std::string file(8, '\0');
  const std::uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) file[static_cast<std::size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xFF);
  file += text;
  file += data;
  write_file_atomically(path, file, progress);
}

Loaded load_safetensors(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, "cannot be opened (missing or unreadable)");
  std::string file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (file.size() < 8)
    fail(path, "is truncated: " + std::to_string(file.size()) + " bytes, shorter than the header length");
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(file[static_cast<std::size_t>(i)]);
  if (n > kMaxHeaderBytes || n > file.size() - 8)
    fail(path, "header length " + std::to_string(n) + " runs past the end of the file (" + std::to_string(file.size()) +
                   " bytes)");
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(file.begin() + 8, file.begin() + 8 + static_cast<std::ptrdiff_t>(n));
  } catch (const nlohmann::json::exception& e) {
    fail(path, std::string("header is not valid JSON (") + e.what() + ")");
  }
  if (!header.is_object()) fail(path, "header is not a JSON object");
  const char* data = file.data() + 8 + n;
  const std::uint64_t data_size = file.size() - 8 - n;
  Loaded loaded;
  struct Range {
    std::uint64_t begin, end;
    std::string name;
  };
  std::vector<Range> ranges;
  for (auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) fail(path, "__metadata__ is not an object");
      for (auto& [key, value] : entry.items()) {
        if (!value.is_string()) fail(path, "metadata '" + key + "' is not a string");
        loaded.metadata[key] = value.get<std::string>();
      }
      continue;
    }
    if (!entry.is_object() || !entry.contains("dtype") || !entry.contains("shape") || !entry.contains("data_offsets"))
      fail(path, "tensor '" + name + "' lacks dtype, shape or data_offsets");
    if (!entry["dtype"].is_string() || entry["dtype"] != "F32")
      fail(path, "tensor '" + name + "' has dtype " + entry["dtype"].dump() + "; this course reads F32 only");
    const auto& shape_json = entry["shape"];
    const auto& offsets = entry["data_offsets"];
    if (!shape_json.is_array() || !offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
        !offsets[1].is_number_unsigned())
      fail(path, "tensor '" + name + "' has a malformed shape or data_offsets");
    Shape shape;
    std::uint64_t count = 1;
    for (const auto& d : shape_json) {
      if (!d.is_number_unsigned() || d.get<std::uint64_t>() > (1ull << 40))
        fail(path, "tensor '" + name + "' has a bad dimension");
      shape.push_back(d.get<std::int64_t>());
      count *= d.get<std::uint64_t>();
      if (count > (1ull << 40)) fail(path, "tensor '" + name + "' is implausibly large");
    }
    const std::uint64_t begin = offsets[0], end = offsets[1];
    if (begin > end || end > data_size)
      fail(path, "tensor '" + name + "' has data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
                     "] outside the data section of " + std::to_string(data_size) + " bytes");
    if (end - begin != count * sizeof(float))
      fail(path,
           "tensor '" + name + "' has shape " + shape_string(shape) + " but " + std::to_string(end - begin) + " bytes");
    ranges.push_back({begin, end, name});
    std::vector<float> values(count);
    if (count) std::memcpy(values.data(), data + begin, count * sizeof(float));
    loaded.tensors.emplace_back(name, Tensor::from_host(values, shape));
  }
  // The data section must be covered exactly: no overlaps, no holes (the format's own rule).
  std::sort(ranges.begin(), ranges.end(), [](const Range& a, const Range& b) { return a.begin < b.begin; });
  std::uint64_t at = 0;
  for (const auto& r : ranges) {
    if (r.begin < at) fail(path, "tensor '" + r.name + "' overlaps another tensor's bytes");
    if (r.begin > at) fail(path, "the data section has a hole before tensor '" + r.name + "'");
    at = r.end;
  }
  if (at != data_size)
    fail(path, "the data section has " + std::to_string(data_size - at) + " bytes that no tensor owns");
  std::sort(loaded.tensors.begin(), loaded.tensors.end(), [&](const auto& a, const auto& b) {
    auto pos = [&](const std::string& name) {
      return std::find_if(ranges.begin(), ranges.end(), [&](const Range& r) { return r.name == name; })->begin;
    };
    return pos(a.first) < pos(b.first);
  });
  auto checksum = loaded.metadata.find("checksum");
  if (checksum != loaded.metadata.end() && checksum->second != checksum_of(header, data, data_size))
    fail(path, "checksum mismatch: the header or the tensors' bytes were changed or damaged");
  loaded.metadata.erase("checksum");
  return loaded;
}

}  // namespace course::checkpoint
