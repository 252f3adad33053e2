// Checkpoints in the safetensors format (huggingface/safetensors), so a user can open them from Python
// with `safetensors`, `torch` or twenty lines of the standard library:
//   8 bytes   the header's length N, little-endian unsigned
//   N bytes   JSON: {"__metadata__": {string: string}, "name": {"dtype": "F32", "shape": [...],
//             "data_offsets": [begin, end]}, ...}, padded with spaces
//   the rest  the tensors' bytes, little-endian, each at its offsets (relative to the data section)
// The course adds "checksum" (of the header's content and the data section; its kind, "checksum_kind", in
// checkpoint/checksum.h) to the metadata, so a flipped byte is found. Writing is atomic: a temporary file in the same folder, fsync, rename, fsync of the
// folder, so a crash at any moment leaves either the old file or the new one, never half of one.
#pragma once
#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/tensor/tensor.h"

namespace course::checkpoint {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;
using Metadata = std::map<std::string, std::string>;

// A file that is not a valid checkpoint: the message names the file and what is wrong with it.
struct CheckpointError : std::runtime_error {
  using std::runtime_error::runtime_error;
  // "<path>: <what>"
  CheckpointError(const std::string& path, const std::string& what) : std::runtime_error(path + ": " + what) {}
};

// Called as the bytes go out (written so far, total): for progress, and for chapter 06's
// --fail-during-save, which kills the writer halfway to show that the previous checkpoint survives.
using WriteProgress = std::function<void(std::size_t written, std::size_t total)>;

// How bytes reach a file atomically: write_file_atomically (below), or another of its contract given to a
// checkpoint folder (chapter 06's own, its exercise 06.1).
using FileWriter = std::function<void(const std::string& path, const std::vector<std::string_view>& pieces,
                                      const WriteProgress& progress)>;

// Writes `tensors` (float32, bfloat16 or float16: F32, BF16, F16; any device) and `metadata` to `path` atomically, and returns the checksum it
// recorded (16 hex digits). Throws CheckpointError. `writer`: another FileWriter than the library's (which
// writes the header last, its checksum computed while the data goes out); given one, the checksum is
// computed first and the file handed over whole.
std::string save_safetensors(const std::string& path, const NamedTensors& tensors, const Metadata& metadata = {},
                      const WriteProgress& progress = {}, const FileWriter& writer = {});

struct Loaded {
  NamedTensors tensors;  // on the CPU, in the file's order of offsets
  Metadata metadata;
  bool checksummed = false;  // the file carried a checksum, and it matched (the course's checkpoints always do)
  std::string checksum;      // that checksum
};
// Reads and validates `path`: the header length within the file, valid JSON, known dtypes, shapes that
// match their byte ranges, offsets inside the data section that neither overlap nor leave holes, and the
// checksum when present (files from other writers have none; a file written before "checksum_kind" has the
// earlier kind). The tensors' bytes go straight from the file into their memory, hashed as they arrive.
// Throws CheckpointError on the first problem; never returns a partial load.
Loaded load_safetensors(const std::string& path);

// Writes `bytes` to `path` atomically (temporary file, fsync, rename, fsync of the folder). What it
// replaces must be a regular file (or nothing yet): a device, a folder, a pipe or a link is refused
// with CheckpointError, never replaced.
void write_file_atomically(const std::string& path, const std::string& bytes, const WriteProgress& progress = {});
// The same for bytes in several places, written one after the other.
void write_file_atomically(const std::string& path, const std::vector<std::string_view>& pieces,
                           const WriteProgress& progress = {});

// Whether a file name is one of write_file_atomically's temporary files (".name.tmp.PID"): what a
// writer that died left behind.
bool is_partial_write(const std::string& file_name);

}  // namespace course::checkpoint
