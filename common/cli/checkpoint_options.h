// --ckpt-dir, --ckpt-every, --keep and --resume: where a chapter writes its checkpoints, how often, how
// many it keeps, and whether it continues from them (chapters 06 and 07). One name and one bound each;
// the chapter sets its defaults in the struct before adding the flags.
#pragma once
#include "common/cli/forward.h"
#include <cstdint>
#include <string>

namespace course::cli {

struct CheckpointOptions {
  std::string dir;         // --ckpt-dir
  std::int64_t every = 20;  // --ckpt-every: a checkpoint every N steps, and at the end
  int keep = 3;             // --keep: the newest K
  bool resume = false;      // --resume
};

// `required`: the chapter always checkpoints (06), or only with --ckpt-dir (07). `dir_help` says what
// the folder holds; `resume_help` what a resume must match.
void add_checkpoint_options(CLI::App& app, CheckpointOptions& options, bool required, const std::string& dir_help,
                            const std::string& resume_help);

}  // namespace course::cli
