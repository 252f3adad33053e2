// The watchdog: a collective that has not finished in time aborts the whole job, with a message that
// names the operation, its sequence number and the rank. A rank that skips or reorders a collective
// then fails fast and explains itself, instead of leaving every rank waiting forever. This is the idea
// of PyTorch's NCCL watchdog (TORCH_NCCL_ASYNC_ERROR_HANDLING), here for both backends.
#pragma once
#include <chrono>
#include <cstdint>
#include <string>

namespace course::comm {

// Starts watching; returns an id for finish(). Thread-safe.
std::uint64_t watchdog_begin(const std::string& operation, long sequence, int rank, std::chrono::milliseconds timeout);
void watchdog_end(std::uint64_t id);

}  // namespace course::comm
