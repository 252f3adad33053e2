// The safetensors writer and the validating reader.
#include "common/checkpoint/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <nlohmann/json.hpp>
#include <sstream>

namespace course::checkpoint {
namespace {

// The header is JSON, so it cannot be larger than this without being something else.
constexpr std::uint64_t kMaxHeaderBytes = 100u << 20;

// FNV-1a, eight bytes at a time (little-endian words of the whole stream, the tail zero-padded): each
// step is a bijection of the state, so any single changed word changes the result, at memory speed
// rather than a multiply per byte. The stream may arrive in pieces of any length.
class Hash {
 public:
  void add(const char* bytes, std::size_t n) {
    while (n > 0 && pending_size_ > 0) {  // complete the word the last piece left open
      pending_[pending_size_++] = *bytes++;
      --n;
      if (pending_size_ == 8) mix_pending();
    }
    for (; n >= 8; bytes += 8, n -= 8) {
      std::uint64_t word;
      std::memcpy(&word, bytes, 8);
      mix(word);
    }
    for (; n > 0; --n) pending_[pending_size_++] = *bytes++;
  }
  std::uint64_t finish() {
    if (pending_size_ > 0) {
      std::fill(pending_ + pending_size_, pending_ + 8, '\0');
      mix_pending();
    }
    return state_;
  }

 private:
  void mix(std::uint64_t word) { state_ = (state_ ^ word) * 0x100000001b3ULL; }
  void mix_pending() {
    std::uint64_t word;
    std::memcpy(&word, pending_, 8);
    mix(word);
    pending_size_ = 0;
  }
  std::uint64_t state_ = 0xcbf29ce484222325ULL;
  char pending_[8] = {};
  std::size_t pending_size_ = 0;
};

// The checksum covers the header's content (every entry and metadata value but the checksum itself,
// as canonical JSON) and each tensor's bytes: a flipped byte anywhere that still parses is caught.
std::string checksum_text(std::uint64_t value) {
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(value));
  return text;
}
std::string checksum_of(nlohmann::json header, const std::vector<std::string_view>& data) {
  if (header.contains("__metadata__")) header["__metadata__"].erase("checksum");
  const std::string canonical = header.dump();
  Hash hash;
  hash.add(canonical.data(), canonical.size());
  for (const auto& piece : data) hash.add(piece.data(), piece.size());
  return checksum_text(hash.finish());
}

// The header as it opens the file: its length (8 bytes, little-endian), then the JSON with `sum` as its
// checksum, padded with spaces so that the data section starts 8-byte aligned.
std::string header_bytes_with(nlohmann::json header, const std::string& sum) {
  header["__metadata__"]["checksum"] = sum;
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::string prefix(8, '\0');
  const std::uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) prefix[static_cast<std::size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xFF);
  return prefix + text;
}

void fsync_or_fail(int fd, const std::string& path) {
  if (::fsync(fd) != 0) throw CheckpointError(path, std::string("fsync failed (") + std::strerror(errno) + ")");
}

}  // namespace

bool is_partial_write(const std::string& file_name) {
  return file_name.size() > 1 && file_name[0] == '.' && file_name.find(".tmp.") != std::string::npos;
}

void write_file_atomically(const std::string& path, const std::string& bytes, const WriteProgress& progress) {
  write_file_atomically(path, std::vector<std::string_view>{bytes}, progress);
}

namespace {
// With `final_first`, the first piece is a placeholder of the right length: once the others are
// written, final_first() gives its real bytes (for the header, whose checksum is computed meanwhile).
void write_atomically(const std::string& path, const std::vector<std::string_view>& pieces,
                      const WriteProgress& progress, const std::function<std::string()>& final_first) {
  namespace fs = std::filesystem;
  const fs::path target(path);
  const fs::path folder = target.has_parent_path() ? target.parent_path() : fs::path(".");
  std::string hidden = std::string(".") + target.filename().string();  // ".name.tmp.PID", beside the target
  hidden += ".tmp.";
  hidden += std::to_string(::getpid());
  const std::string temporary = (folder / hidden).string();
  struct stat existing {};
  if (::lstat(path.c_str(), &existing) == 0 && !S_ISREG(existing.st_mode))
    throw CheckpointError(path, "is not a regular file (a folder, a device, a pipe or a link); a checkpoint replaces only a regular file");
  // Made anew (O_EXCL, never through a link left at its name): what is there already is a dead writer's
  // of the same pid or something planted, removed (unlink removes a link, not its target) before it.
  int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW, 0644);
  if (fd < 0 && errno == EEXIST && ::unlink(temporary.c_str()) == 0)
    fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW, 0644);
  if (fd < 0) throw CheckpointError(path, std::string("cannot write into its folder (") + std::strerror(errno) + ")");
  // Straight from each piece's memory, in chunks: progress is reported between them, and the
  // kernel streams them to disk meanwhile.
  std::size_t total = 0;
  for (const auto& piece : pieces) total += piece.size();
  const std::size_t chunk = std::clamp<std::size_t>(total / 8, 4096, std::size_t{8} << 20);
  std::size_t written = 0;
  for (const auto& piece : pieces) {
    std::size_t at = 0;
    while (at < piece.size()) {
      const ssize_t n = ::write(fd, piece.data() + at, std::min(chunk, piece.size() - at));
      if (n < 0) {
        if (errno == EINTR) continue;
        const std::string why = std::strerror(errno);
        ::close(fd);
        ::unlink(temporary.c_str());
        throw CheckpointError(path, "write failed (" + why + ")");
      }
      at += static_cast<std::size_t>(n);
      written += static_cast<std::size_t>(n);
      if (progress) progress(written, total);
    }
  }
  if (final_first) {
    const std::string first = final_first();
    if (first.size() != pieces.front().size() ||
        ::pwrite(fd, first.data(), first.size(), 0) != static_cast<ssize_t>(first.size())) {
      const std::string why = std::strerror(errno);
      ::close(fd);
      ::unlink(temporary.c_str());
      throw CheckpointError(path, "write of the header failed (" + why + ")");
    }
  }
  fsync_or_fail(fd, temporary);
  ::close(fd);
  if (std::rename(temporary.c_str(), path.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    ::unlink(temporary.c_str());
    throw CheckpointError(path, "rename failed (" + why + ")");
  }
  // The rename is durable only once the folder's entry is on disk.
  int dir = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY);
  if (dir >= 0) {
    fsync_or_fail(dir, folder.string());
    ::close(dir);
  }
}

}  // namespace

void write_file_atomically(const std::string& path, const std::vector<std::string_view>& pieces,
                           const WriteProgress& progress) {
  write_atomically(path, pieces, progress, {});
}

std::string save_safetensors(const std::string& path, const NamedTensors& tensors, const Metadata& metadata,
                      const WriteProgress& progress, const FileWriter& writer) {
  // The bytes go from each tensor's memory to the file: no copy on the CPU, one to the host for CUDA.
  std::vector<Tensor> staged;  // CUDA tensors' host copies, kept alive until written
  std::vector<std::string_view> data;
  nlohmann::json header = nlohmann::json::object();
  std::size_t offset = 0;
  for (const auto& [name, tensor] : tensors) {
    if (name == "__metadata__" || header.contains(name))
      throw CheckpointError(path, "tensor name '" + name + "' is reserved or repeated");
    const void* values = nullptr;
    if (tensor.device() == Device::cpu) {
      values = tensor.raw();
    } else {
      const Tensor host = tensor.to(Device::cpu);
      staged.push_back(host);
      values = host.raw();
    }
    const std::size_t bytes = tensor.nbytes();  // x86: little-endian, as the format's bytes are
    data.emplace_back(static_cast<const char*>(values), bytes);
    header[name] = {{"dtype", safetensors_dtype_name(tensor.dtype())},
                    {"shape", tensor.shape()},
                    {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  nlohmann::json meta = nlohmann::json::object();
  for (const auto& [key, value] : metadata) meta[key] = value;
  header["__metadata__"] = meta;
  if (writer) {  // another writer: the whole file in order, its header (and so its checksum) first
    const std::string sum = checksum_of(header, data);
    const std::string first = header_bytes_with(header, sum);
    std::vector<std::string_view> pieces{first};
    pieces.insert(pieces.end(), data.begin(), data.end());
    writer(path, pieces, progress);
    return sum;
  }
  // The checksum is computed on another thread while the data goes out, and the header is written
  // last, over a placeholder of the same length: hashing costs no time next to the disk.
  auto checksum = std::async(std::launch::async, [&] { return checksum_of(header, data); });
  auto header_bytes = [&](const std::string& sum) { return header_bytes_with(header, sum); };
  const std::string placeholder = header_bytes(std::string(16, '0'));  // a checksum is 16 hex digits
  std::vector<std::string_view> pieces{placeholder};
  pieces.insert(pieces.end(), data.begin(), data.end());
  std::string written;
  try {
    write_atomically(path, pieces, progress, [&] {
      written = checksum.get();
      return header_bytes(written);
    });
  } catch (...) {
    if (checksum.valid()) checksum.wait();  // the thread reads `header` and `data`: let it finish first
    throw;
  }
  return written;
}

Loaded load_safetensors(const std::string& path) {
  // Only a regular file: a folder reads as endless garbage and a pipe never ends.
  struct stat what {};
  if (::stat(path.c_str(), &what) == 0 && !S_ISREG(what.st_mode))
    throw CheckpointError(path, "is not a regular file (a folder, a device or a pipe)");
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) throw CheckpointError(path, "cannot be opened (missing or unreadable)");
  std::string file(static_cast<std::size_t>(in.tellg()), '\0');
  in.seekg(0);
  if (!in.read(file.data(), static_cast<std::streamsize>(file.size()))) throw CheckpointError(path, "could not be read");
  if (file.size() < 8)
    throw CheckpointError(path, "is truncated: " + std::to_string(file.size()) + " bytes, shorter than the header length");
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(file[static_cast<std::size_t>(i)]);
  if (n > kMaxHeaderBytes || n > file.size() - 8)
    throw CheckpointError(path, "header length " + std::to_string(n) + " runs past the end of the file (" + std::to_string(file.size()) +
                   " bytes)");
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(file.begin() + 8, file.begin() + 8 + static_cast<std::ptrdiff_t>(n));
  } catch (const nlohmann::json::exception& e) {
    throw CheckpointError(path, std::string("header is not valid JSON (") + e.what() + ")");
  }
  if (!header.is_object()) throw CheckpointError(path, "header is not a JSON object");
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
      if (!entry.is_object()) throw CheckpointError(path, "__metadata__ is not an object");
      for (auto& [key, value] : entry.items()) {
        if (!value.is_string()) throw CheckpointError(path, "metadata '" + key + "' is not a string");
        loaded.metadata[key] = value.get<std::string>();
      }
      continue;
    }
    if (!entry.is_object() || !entry.contains("dtype") || !entry.contains("shape") || !entry.contains("data_offsets"))
      throw CheckpointError(path, "tensor '" + name + "' lacks dtype, shape or data_offsets");
    DType dtype = DType::float32;
    if (!entry["dtype"].is_string() || !dtype_from_safetensors(entry["dtype"].get<std::string>(), &dtype))
      throw CheckpointError(path, "tensor '" + name + "' has dtype " + entry["dtype"].dump() + "; this course reads F32, BF16 and F16");
    const auto& shape_json = entry["shape"];
    const auto& offsets = entry["data_offsets"];
    if (!shape_json.is_array() || !offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
        !offsets[1].is_number_unsigned())
      throw CheckpointError(path, "tensor '" + name + "' has a malformed shape or data_offsets");
    Shape shape;
    std::uint64_t count = 1;
    for (const auto& d : shape_json) {
      if (!d.is_number_unsigned() || d.get<std::uint64_t>() > (1ull << 40))
        throw CheckpointError(path, "tensor '" + name + "' has a bad dimension");
      shape.push_back(d.get<std::int64_t>());
      count *= d.get<std::uint64_t>();
      if (count > (1ull << 40)) throw CheckpointError(path, "tensor '" + name + "' is implausibly large");
    }
    const std::uint64_t begin = offsets[0], end = offsets[1];
    if (begin > end || end > data_size)
      throw CheckpointError(path, "tensor '" + name + "' has data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
                     "] outside the data section of " + std::to_string(data_size) +
                     " bytes (a truncated file, or wrong offsets)");
    if (end - begin != count * element_size(dtype))
      throw CheckpointError(path,
           "tensor '" + name + "' has shape " + shape_string(shape) + " but " + std::to_string(end - begin) + " bytes");
    ranges.push_back({begin, end, name});
    Tensor tensor = Tensor::empty(shape, Device::cpu, dtype);
    if (count) std::memcpy(tensor.raw(), data + begin, count * element_size(dtype));
    loaded.tensors.emplace_back(name, tensor);
  }
  // The data section must be covered exactly: no overlaps, no holes (the format's own rule).
  std::sort(ranges.begin(), ranges.end(), [](const Range& a, const Range& b) { return a.begin < b.begin; });
  std::uint64_t at = 0;
  for (const auto& r : ranges) {
    if (r.begin < at) throw CheckpointError(path, "tensor '" + r.name + "' overlaps another tensor's bytes");
    if (r.begin > at) throw CheckpointError(path, "the data section has a hole before tensor '" + r.name + "'");
    at = r.end;
  }
  if (at != data_size)
    throw CheckpointError(path, "the data section has " + std::to_string(data_size - at) + " bytes that no tensor owns");
  std::sort(loaded.tensors.begin(), loaded.tensors.end(), [&](const auto& a, const auto& b) {
    auto pos = [&](const std::string& name) {
      return std::find_if(ranges.begin(), ranges.end(), [&](const Range& r) { return r.name == name; })->begin;
    };
    return pos(a.first) < pos(b.first);
  });
  auto checksum = loaded.metadata.find("checksum");
  if (checksum != loaded.metadata.end() &&
      checksum->second != checksum_of(header, {std::string_view(data, static_cast<std::size_t>(data_size))}))
    throw CheckpointError(path, "checksum mismatch: the header or the tensors' bytes were changed or damaged");
  loaded.checksummed = checksum != loaded.metadata.end();
  if (loaded.checksummed) loaded.checksum = checksum->second;
  loaded.metadata.erase("checksum");
  return loaded;
}

}  // namespace course::checkpoint
