// Killing a rank on purpose, as a lost machine does (chapters 06 and 07): --fail-at-step K kills
// --fail-rank with SIGKILL at the start of step K, or with --fail-during-save halfway through writing
// its checkpoint of step K. On the first attempt only: the launcher (scripts/failover.py) numbers its
// attempts in COURSE_RESTART_COUNT, as torchrun does in TORCHELASTIC_RESTART_COUNT.
#pragma once
#include <cstdint>
#include <string>

#include "common/cli/forward.h"

#include "common/checkpoint/safetensors.h"

namespace course::cli {

struct KillOptions {
  std::int64_t at_step = -1;  // -1: none
  int rank = 0;
  bool during_save = false;

  static int restart_count();  // the launcher's attempt number, 0 for the first
  bool armed() const { return at_step >= 0 && restart_count() == 0; }
  // At the start of `step` on `my_rank`: SIGKILL when asked (no handler, no goodbye).
  void at_step_start(std::int64_t step, int my_rank) const;
  // The progress of `my_rank`'s checkpoint write of `step`: SIGKILL halfway through, when asked.
  checkpoint::WriteProgress during_save_of(std::int64_t step, int my_rank) const;
  // "rank 1 will be killed (SIGKILL) at the start of step 50, on this first attempt only"
  std::string describe() const;
};
void add_kill_options(CLI::App& app, KillOptions& options, std::int64_t max_step);
// A UsageError naming the flag: a rank outside the world, a step never reached, --fail-during-save
// without a step that writes a checkpoint, or (`only_rank0_writes`) naming a rank that writes none.
void check_kill_options(const KillOptions& options, std::int64_t steps, std::int64_t ckpt_every, int ranks,
                        bool only_rank0_writes);

}  // namespace course::cli
