// Chapter 06's flags.
#include "06_checkpoint_failover/options.h"

#include <CLI/CLI.hpp>

#include "common/core/errors.h"
#include "common/ops/kernel_faults.h"  // --fault truncating-gelu, ce-next-row
#include "common/parallel/distributed_sampler.h"  // --fault skewed-share

namespace course::chapter06 {

void add_options(CLI::App& app, Options& o) {
  o.training = {200, 240, 1e-3f};
  cli::add_common_options(app, o.common);
  cli::add_distributed_options(app, o.distributed);
  cli::add_save_option(app, o.save);
  cli::add_model_options(app, o.models);
  cli::add_training_options(app, o.training, "Learning rate (Adam's; for the GPT, AdamW's peak)");
  cli::add_precision_options(app, o.precision);
  cli::add_reduce_dtype_option(app, o.precision);  // DDP's gradients in 16 bits
  cli::add_mlp_options(app, o.mlp);
  cli::add_checkpoint_options(app, o.checkpoints, /*required=*/true, "Folder of the checkpoints (rank 0 writes it)",
                              "any world size, the same --global-batch and --seed");
  app.add_option("--log-every", o.log_every, "Print the loss every N steps")->check(cli::PositiveInteger)
      ->capture_default_str();
  cli::add_kill_options(app, o.kill, cli::kMaxSteps);
  cli::refuse_inert(app, "--fault", [&app, &o] {  // zero-saved-moments breaks the writes, the others a resume
    return o.faults.fault == "none" || o.faults.fault == "zero-saved-moments" || o.checkpoints.resume ||
                   app.count("--fault-from-step") > 0
               ? std::string()
               : o.faults.fault + " breaks a resume: add --resume, or --fault-from-step N to break step N of this run";
  });
  app.add_option("--mtbf-hours", o.mtbf_hours, "Mean time between failures, for the checkpoint interval it suggests "
                                               "(Young's approximation)")
      ->check(cli::PositiveFinite & CLI::Range(1e-6, 1e6))->capture_default_str();
  cli::add_verify_options(app, o.verify, "against one rank, and the end against the uninterrupted run: "
                          "bit-identical at an unchanged world size", o.faults, {{"lose-optimizer-state", "the optimizer's state is lost"},
                                         {"repeat-batch", "the data goes back one batch"},
                                         parallel::skewed_share_fault(), truncating_gelu_flag(), ce_next_row_flag(),
                                         {"zero-saved-moments", "the checkpoints written carry Adam's second moments "
                                                                "zeroed (a writer's bug)"}});
}

void check_options(const CLI::App& app, Options& o) {
  // Without --fault-from-step, the fault breaks the resume (the first step of a resumed run).
  o.fault_step_given = app.count("--fault-from-step") > 0;
  // zero-saved-moments needs no --verify: every save's digest of the state in memory catches it.
  cli::arm_faults(o.faults, o.verify || o.faults.fault == "zero-saved-moments", o.training.steps);
  if (o.fault_step_given && o.faults.from_step == 0 && o.faults.fault != "none")
    throw UsageError("--fault-from-step: chapter 06's faults break what a step inherits from the one before (the "
                     "optimizer's state, the place in the data), which step 0 has not; give 1 or more");
}

std::string recipe_of(const Options& o) { return o.models.model == "gpt" ? "adamw" : "adam"; }

}  // namespace course::chapter06
