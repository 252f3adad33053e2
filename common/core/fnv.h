// FNV-1a (Fowler, Noll and Vo), byte by byte: the course's 64-bit digests of a model configuration and
// of a training state. The safetensors checksum, and the replicas' checksum of their parameters at every
// step, mix 8-byte words in eight chains instead (checkpoint/checksum.h), for speed.
#pragma once
#include <cstddef>
#include <cstdint>

namespace course {

constexpr std::uint64_t kFnvOffset = 0xcbf29ce484222325ULL;

// `hash` continued over `bytes` bytes at `data` (start from kFnvOffset).
inline std::uint64_t fnv1a(std::uint64_t hash, const void* data, std::size_t bytes) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < bytes; ++i) hash = (hash ^ p[i]) * 0x100000001b3ULL;
  return hash;
}

}  // namespace course
