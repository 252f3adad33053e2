// Chapter 04's flags.
#include "04_ddp/options.h"

#include <CLI/CLI.hpp>

#include "common/ops/kernel_faults.h"             // --fault truncating-gelu, ce-next-row
#include "common/parallel/distributed_sampler.h"  // --fault skewed-share

namespace course::chapter04 {

void add_options(CLI::App& app, Options& o) {
  cli::add_common_options(app, o.common);
  cli::add_distributed_options(app, o.distributed);
  cli::add_save_option(app, o.save);
  app.add_option("--init", o.init, "Start from the parameters in this safetensors file (names and shapes must match "
                                   "the model)")->check(cli::InputFile);
  auto* steps = cli::add_training_options(app, o.training, "Learning rate (scale it with the global batch, see README)");
  app.add_option("--accum", o.accum, "Micro-batches per step on each rank (gradient accumulation)")
      ->check(cli::PositiveInteger & CLI::Range(1, 1 << 16))->capture_default_str();
  app.add_option("--epochs", o.epochs, "Train whole epochs instead of --steps")
      ->check(cli::PositiveInteger & CLI::Range(std::int64_t{1}, cli::kMaxSteps))->excludes(steps);
  cli::add_precision_options(app, o.precision);
  cli::add_reduce_dtype_option(app, o.precision);  // DDP's gradients in 16 bits
  cli::add_mlp_options(app, o.mlp);
  cli::add_model_options(app, o.models);
  cli::add_recompute_option(app, o.models);  // --recompute: the GPT's activations
  app.add_option("--optimizer", o.optimizer, "sgd, or adamw with warm-up, cosine decay and clipping (for the GPT)")
      ->check(CLI::IsMember({"sgd", "adamw"}))->capture_default_str();
  app.add_option("--log-every", o.log_every, "Print the loss every N steps")->check(cli::PositiveInteger)->capture_default_str();
  app.add_flag("--drift", o.drift, "Also train one rank free-running, twice (the second summing each batch in reverse), "
                                   "and report how far the final parameters drift against that noise floor");
  cli::add_verify_options(app, o.verify, "against one rank with the global batch: the averaged gradient, the loss "
                          "and the update", o.faults, {{"average-twice", "the average divided by the world size twice"},
                                         parallel::skewed_share_fault(), truncating_gelu_flag(), ce_next_row_flag(),
                                         {"skip-rank-share", "the last rank's share of the gradient never arrives"},
                                         {"stray-replica", "the last rank's update moves its first weight one unit in "
                                                           "the last place further (rank 0 stays right)"},
                                         {"stray-moment", "the last rank's update moves its AdamW first moment of "
                                                          "the first weight one unit in the last place further"},
                                         {"adamw-decay", "AdamW's decoupled weight decay is not scaled by the "
                                                         "learning rate (a slip in the optimizer class, shared by "
                                                         "the run and the reference's replay)"}});
}

}  // namespace course::chapter04
