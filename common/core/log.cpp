// Which rank logs.
#include "common/core/log.h"

namespace course {
namespace {
int g_rank = 0;
bool g_all = false;
}  // namespace

void set_log_rank(int rank, bool all_ranks_verbose) {
  g_rank = rank;
  g_all = all_ranks_verbose;
}
bool is_log_rank() { return g_rank == 0 || g_all; }
int log_rank() { return g_rank; }
bool all_ranks_log() { return g_all; }

}  // namespace course
