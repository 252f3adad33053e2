// Logging: rank 0 speaks, the other ranks stay quiet unless asked (--verbose).
#pragma once
#include <cstdio>
#include <utility>

namespace course {

void set_log_rank(int rank, bool all_ranks_verbose = false);
bool is_log_rank();
int log_rank();

bool all_ranks_log();

template <class... Args>
void log(const char* format, Args&&... args) {
  if (!is_log_rank()) return;
  if (all_ranks_log()) std::printf("[rank %d] ", log_rank());
  if constexpr (sizeof...(Args) == 0) std::fputs(format, stdout);
  else std::printf(format, std::forward<Args>(args)...);
  std::fflush(stdout);
}

}  // namespace course
