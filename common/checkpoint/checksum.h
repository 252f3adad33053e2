// The safetensors checksum: FNV-1a (Fowler, Noll and Vo) over 8-byte words of a stream that arrives in
// pieces (the header's canonical JSON, then the data section). Each step of FNV-1a, (state ^ word) *
// prime, is a bijection of the state, so a single changed word changes the result.
//
// Two kinds, named in a file's metadata ("checksum_kind"):
//   lanes (kLanesKind, written since 2026-11-29): eight independent FNV-1a chains, word i of the stream
//     into chain i mod 8, then the eight states and the stream's length into one more. A chain's
//     multiply waits for the one before it (about four cycles a word), so one chain hashes at a third of
//     memory speed; eight in flight together keep up with a read from the page cache.
//   words (a file with no "checksum_kind"): one chain over every word, as files written before carry.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace course::checkpoint {

enum class ChecksumKind { words, lanes };

// The metadata key that names the kind, and the kind new files are written with.
inline constexpr const char* kChecksumKindKey = "checksum_kind";
inline constexpr const char* kLanesKind = "fnv1a-8-lanes";

// The kind a file's "checksum_kind" names (absent: words); nothing for a name this course does not know.
std::optional<ChecksumKind> checksum_kind(const std::optional<std::string>& name);

class StreamChecksum {
 public:
  explicit StreamChecksum(ChecksumKind kind) : kind_(kind) { state_.fill(kOffset); }
  // The next `n` bytes of the stream (pieces of any length, the tail zero-padded to a word at the end).
  void add(const char* bytes, std::size_t n);
  void add(std::string_view piece) { add(piece.data(), piece.size()); }
  // The checksum of the whole stream, once: as the 16 hex digits a file's metadata holds, or as the number.
  std::string finish();
  std::uint64_t value();

 private:
  static constexpr std::uint64_t kOffset = 0xcbf29ce484222325ULL;
  static constexpr std::size_t kLanes = 8;
  std::size_t block() const { return kind_ == ChecksumKind::lanes ? 8 * kLanes : 8; }
  void mix_blocks(const char* bytes, std::size_t blocks);  // whole blocks of block() bytes

  ChecksumKind kind_;
  std::array<std::uint64_t, kLanes> state_{};  // words: state_[0] alone
  std::array<char, 8 * kLanes> pending_{};     // the open block's bytes
  std::size_t pending_size_ = 0;
  std::uint64_t length_ = 0;
};

}  // namespace course::checkpoint
