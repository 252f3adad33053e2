// The checksum's chains, block by block.
#include "common/checkpoint/checksum.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

namespace course::checkpoint {
namespace {
constexpr std::uint64_t kPrime = 0x100000001b3ULL;

std::uint64_t word_at(const char* bytes) {
  std::uint64_t word;
  std::memcpy(&word, bytes, 8);  // little-endian on x86, as the stream's words are defined
  return word;
}
}  // namespace

std::optional<ChecksumKind> checksum_kind(const std::optional<std::string>& name) {
  if (!name) return ChecksumKind::words;
  if (*name == kLanesKind) return ChecksumKind::lanes;
  return std::nullopt;
}

void StreamChecksum::mix_blocks(const char* bytes, std::size_t blocks) {
  if (kind_ == ChecksumKind::words) {
    std::uint64_t s = state_[0];
    for (std::size_t b = 0; b < blocks; ++b) s = (s ^ word_at(bytes + 8 * b)) * kPrime;
    state_[0] = s;
    return;
  }
  // The eight chains in locals, so that their multiplies overlap.
  std::uint64_t s[kLanes];
  std::copy(state_.begin(), state_.end(), s);
  for (std::size_t b = 0; b < blocks; ++b, bytes += 8 * kLanes) {
#pragma GCC unroll 8
    for (std::size_t lane = 0; lane < kLanes; ++lane) s[lane] = (s[lane] ^ word_at(bytes + 8 * lane)) * kPrime;
  }
  std::copy(s, s + kLanes, state_.begin());
}

void StreamChecksum::add(const char* bytes, std::size_t n) {
  if (n == 0) return;  // an empty tensor's bytes may be a null pointer, which memcpy must not be given
  length_ += n;
  const std::size_t size = block();
  if (pending_size_ > 0) {  // complete the block the last piece left open
    const std::size_t take = std::min(n, size - pending_size_);
    std::memcpy(pending_.data() + pending_size_, bytes, take);
    pending_size_ += take, bytes += take, n -= take;
    if (pending_size_ < size) return;
    mix_blocks(pending_.data(), 1);
    pending_size_ = 0;
  }
  const std::size_t whole = n / size;
  mix_blocks(bytes, whole);
  bytes += whole * size, n -= whole * size;
  std::memcpy(pending_.data(), bytes, n);
  pending_size_ = n;
}

std::string StreamChecksum::finish() {
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(value()));
  return text;
}

std::uint64_t StreamChecksum::value() {
  // The open block's words into their chains, the last one zero-padded.
  const std::size_t words = (pending_size_ + 7) / 8;
  std::fill(pending_.begin() + static_cast<long>(pending_size_), pending_.begin() + static_cast<long>(8 * words), '\0');
  for (std::size_t w = 0; w < words; ++w) {
    std::uint64_t& s = state_[kind_ == ChecksumKind::words ? 0 : w];
    s = (s ^ word_at(pending_.data() + 8 * w)) * kPrime;
  }
  pending_size_ = 0;
  std::uint64_t result = state_[0];
  if (kind_ == ChecksumKind::lanes) {  // the chains and the length (which tells a zero tail from padding)
    result = kOffset;
    for (const std::uint64_t s : state_) result = (result ^ s) * kPrime;
    result = (result ^ length_) * kPrime;
  }
  return result;
}

}  // namespace course::checkpoint
