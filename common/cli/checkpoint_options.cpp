// The checkpointing flags.
#include "common/cli/checkpoint_options.h"

#include <CLI/CLI.hpp>

#include "common/cli/cli.h"
#include "common/cli/training_options.h"

namespace course::cli {

void add_checkpoint_options(CLI::App& app, CheckpointOptions& o, bool required, const std::string& dir_help,
                            const std::string& resume_help) {
  auto* dir = app.add_option("--ckpt-dir", o.dir, dir_help);
  if (required) dir->required();
  app.add_option("--ckpt-every", o.every, "Write a checkpoint every N steps (and at the end)")
      ->check(PositiveInteger & CLI::Range(std::int64_t{1}, kMaxSteps))
      ->capture_default_str();
  app.add_option("--keep", o.keep, "Keep the newest K checkpoints")
      ->check(PositiveInteger & CLI::Range(1, 1000))
      ->capture_default_str();
  app.add_flag("--resume", o.resume, "Continue from the newest good checkpoint in --ckpt-dir" +
                                         (resume_help.empty() ? std::string() : " (" + resume_help + ")"));
}

}  // namespace course::cli
