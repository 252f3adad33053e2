// The safetensors writer and the validating reader.
#include "common/checkpoint/safetensors.h"

#include "common/checkpoint/checksum.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <future>
#include <nlohmann/json.hpp>

namespace course::checkpoint {
namespace {

// The header is JSON, so it cannot be larger than this without being something else.
constexpr std::uint64_t kMaxHeaderBytes = 100u << 20;

// The checksum covers the header's content (every entry and metadata value but the checksum itself,
// as canonical JSON) and each tensor's bytes, in the file's order: a flipped byte anywhere that still
// parses is caught. The header's canonical JSON is the checksum stream's first piece.
std::string canonical_header(nlohmann::json header) {
  if (header.contains("__metadata__")) header["__metadata__"].erase("checksum");
  return header.dump();
}
std::string checksum_of(const nlohmann::json& header, const std::vector<std::string_view>& data) {
  StreamChecksum sum(ChecksumKind::lanes);
  sum.add(canonical_header(header));
  for (const auto& piece : data) sum.add(piece);
  return sum.finish();
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
  meta[kChecksumKindKey] = kLanesKind;  // the checksum's kind, which the checksum covers
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

namespace {
// Exactly `n` bytes of `fd` at `offset` into `into`; false if the file ends first or the read fails.
bool read_at(int fd, std::uint64_t offset, char* into, std::size_t n) {
  while (n > 0) {
    const ssize_t got = ::pread(fd, into, n, static_cast<off_t>(offset));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return false;
    into += got, offset += static_cast<std::uint64_t>(got), n -= static_cast<std::size_t>(got);
  }
  return true;
}

struct File {  // closed on every way out
  int fd;
  ~File() { ::close(fd); }
};
}  // namespace

Loaded load_safetensors(const std::string& path) {
  // Only a regular file: a folder reads as endless garbage and a pipe never ends.
  struct stat what {};
  if (::stat(path.c_str(), &what) == 0 && !S_ISREG(what.st_mode))
    throw CheckpointError(path, "is not a regular file (a folder, a device or a pipe)");
  const File file{::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK)};
  if (file.fd < 0) throw CheckpointError(path, "cannot be opened (missing or unreadable)");
  if (::fstat(file.fd, &what) != 0 || !S_ISREG(what.st_mode))
    throw CheckpointError(path, "is not a regular file (a folder, a device or a pipe)");
  const auto size = static_cast<std::uint64_t>(what.st_size);
  if (size < 8) throw CheckpointError(path, "is truncated: " + std::to_string(size) + " bytes, shorter than the header length");
  unsigned char length[8];
  if (!read_at(file.fd, 0, reinterpret_cast<char*>(length), 8)) throw CheckpointError(path, "could not be read");
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | length[i];
  if (n > kMaxHeaderBytes || n > size - 8)
    throw CheckpointError(path, "header length " + std::to_string(n) + " runs past the end of the file (" + std::to_string(size) +
                   " bytes)");
  std::string text(static_cast<std::size_t>(n), '\0');
  if (!read_at(file.fd, 8, text.data(), text.size())) throw CheckpointError(path, "could not be read");
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw CheckpointError(path, std::string("header is not valid JSON (") + e.what() + ")");
  }
  if (!header.is_object()) throw CheckpointError(path, "header is not a JSON object");
  const std::uint64_t data_start = 8 + n, data_size = size - data_start;
  Loaded loaded;
  struct Range {
    std::uint64_t begin, end;
    std::string name;
    Shape shape;
    DType dtype;
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
    ranges.push_back({begin, end, name, shape, dtype});
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
  // The checksum's kind: the metadata names it, or a file written before names none (ChecksumKind::words).
  const auto named_kind = loaded.metadata.find(kChecksumKindKey);
  const auto kind = checksum_kind(named_kind == loaded.metadata.end() ? std::nullopt
                                                                      : std::optional<std::string>(named_kind->second));
  const auto checksum = loaded.metadata.find("checksum");
  if (checksum != loaded.metadata.end() && !kind)
    throw CheckpointError(path, "its checksum is of kind '" + named_kind->second + "', which this course does not know (it writes '" +
                                    std::string(kLanesKind) + "'; a file without a kind is of the earlier one)");
  // Each tensor's bytes straight from the file into its memory, a piece at a time, each piece hashed
  // while it is still in the cache: one pass over the data, no second copy. The memory is taken only now
  // that the ranges cover the file once: a header whose tensors overlap asks for no more than the file.
  StreamChecksum sum(kind.value_or(ChecksumKind::lanes));
  sum.add(canonical_header(header));
  constexpr std::size_t kPiece = std::size_t{512} << 10;
  for (const auto& r : ranges) {
    Tensor tensor = Tensor::empty(r.shape, Device::cpu, r.dtype);
    char* into = static_cast<char*>(tensor.raw());
    for (std::uint64_t done = 0; done < r.end - r.begin;) {
      const auto piece = static_cast<std::size_t>(std::min<std::uint64_t>(kPiece, r.end - r.begin - done));
      if (!read_at(file.fd, data_start + r.begin + done, into + done, piece))
        throw CheckpointError(path, "could not be read (it ended or failed before its last tensor's bytes)");
      sum.add(into + done, piece);
      done += piece;
    }
    loaded.tensors.emplace_back(r.name, tensor);
  }
  if (checksum != loaded.metadata.end() && checksum->second != sum.finish())
    throw CheckpointError(path, "checksum mismatch: the header or the tensors' bytes were changed or damaged");
  loaded.checksummed = checksum != loaded.metadata.end();
  if (loaded.checksummed) loaded.checksum = checksum->second;
  loaded.metadata.erase("checksum");
  loaded.metadata.erase(kChecksumKindKey);
  return loaded;
}

}  // namespace course::checkpoint
