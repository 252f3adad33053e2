// Killing a rank on purpose.
#include "common/cli/kill_options.h"

#include <CLI/CLI.hpp>

#include <csignal>
#include <cstdlib>

#include "common/core/errors.h"

namespace course::cli {

int KillOptions::restart_count() {
  const char* text = std::getenv("COURSE_RESTART_COUNT");
  return text ? std::atoi(text) : 0;
}

void KillOptions::at_step_start(std::int64_t step, int my_rank) const {
  if (armed() && !during_save && step == at_step && my_rank == rank) std::raise(SIGKILL);
}

checkpoint::WriteProgress KillOptions::during_save_of(std::int64_t step, int my_rank) const {
  if (!armed() || !during_save || step != at_step || my_rank != rank) return {};
  return [](std::size_t written, std::size_t total) {
    if (2 * written >= total) std::raise(SIGKILL);
  };
}

std::string KillOptions::describe() const {
  return "rank " + std::to_string(rank) + " will be killed (SIGKILL) " +
         (during_save ? "halfway through writing its checkpoint of" : "at the start of") + " step " +
         std::to_string(at_step) + ", on this first attempt only";
}

void add_kill_options(CLI::App& app, KillOptions& o, std::int64_t max_step) {
  app.add_option("--fail-at-step", o.at_step, "Fault injection: kill --fail-rank with SIGKILL at the start of step K "
                                              "(first attempt only)")
      ->check(CLI::Range(std::int64_t{0}, max_step));
  app.add_option("--fail-rank", o.rank, "The rank --fail-at-step kills")->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_flag("--fail-during-save", o.during_save,
               "With --fail-at-step K: kill the rank halfway through writing its checkpoint of step K instead");
}

void check_kill_options(const KillOptions& o, std::int64_t steps, std::int64_t ckpt_every, int ranks,
                        bool only_rank0_writes) {
  if (o.during_save && o.at_step < 0)
    throw UsageError("--fail-during-save: needs --fail-at-step K, the checkpoint step to fail in");
  if (o.at_step < 0) return;
  if (o.armed() && o.rank >= ranks)
    throw UsageError("--fail-rank: " + std::to_string(o.rank) + " is outside the world of " + std::to_string(ranks) +
                     " ranks");
  if (o.at_step >= steps && !(o.during_save && o.at_step == steps))
    throw UsageError("--fail-at-step: " + std::to_string(o.at_step) + " is never reached in --steps " +
                     std::to_string(steps));
  if (o.during_save && (o.at_step < 1 || (o.at_step % ckpt_every != 0 && o.at_step != steps)))
    throw UsageError("--fail-during-save: --fail-at-step must name a step that writes a checkpoint (a multiple of "
                     "--ckpt-every " + std::to_string(ckpt_every) + ")");
  if (o.during_save && only_rank0_writes && o.rank != 0)
    throw UsageError("--fail-during-save: rank 0 writes the checkpoints, so --fail-rank must be 0");
}

}  // namespace course::cli
