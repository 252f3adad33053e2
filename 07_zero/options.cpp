// Chapter 07's flags.
#include "07_zero/options.h"

#include <CLI/CLI.hpp>

#include "07_zero/prediction.h"
#include "common/cli/limits.h"
#include "common/core/errors.h"
#include "common/optim/recipe.h"
#include "common/ops/kernel_faults.h"             // --fault truncating-gelu, ce-next-row
#include "common/parallel/distributed_sampler.h"  // --fault skewed-share

namespace course::chapter07 {

void add_options(CLI::App& app, Options& o) {
  o.training = {20, 240, 1e-3f};
  o.checkpoints.every = 10;
  o.checkpoints.keep = 2;
  o.mlp.samples = 4096;
  o.mlp.layers = 8;
  cli::add_common_options(app, o.common);
  cli::add_distributed_options(app, o.distributed);
  cli::add_model_options(app, o.models);
  cli::add_recompute_option(app, o.models);  // --recompute: the GPT's activations
  app.add_option("--stage", o.stage, "0 (DDP), 1 (optimizer state sharded), 2 (+ gradients), 3 (+ parameters)")
      ->check(CLI::Range(0, 3))->capture_default_str();
  app.add_option("--offload", o.offload,
                 "ZeRO-Offload: keep the optimizer's state in host memory and run AdamW on the CPU (optimizer), and "
                 "at stage 3 this rank's part of the parameters too (parameters)")
      ->check(CLI::IsMember({"none", "optimizer", "parameters"}))->capture_default_str();
  cli::add_training_options(app, o.training, "AdamW learning rate");
  cli::add_mlp_options(app, o.mlp);
  cli::add_precision_options(app, o.precision);
  app.add_option("--accum", o.accum, "Micro-batches per step on each rank")->check(cli::PositiveInteger & CLI::Range(1, 1 << 16))->capture_default_str();
  app.add_option("--clip", o.clip, "Clip the gradient's global norm to this (0: off)")
      ->check(cli::NonNegativeFinite)->capture_default_str();
  app.add_option("--log-every", o.log_every, "Print every N steps")->check(cli::PositiveInteger)->capture_default_str();
  cli::add_memory_limit_option(app, o.mem_limit_mb);
  cli::add_save_option(app, o.save);
  cli::add_sim_network_option(app, o.sim_network);
  app.add_option("--predict", o.predict,
                 "Price each stage's step with the course's cost model, calibrated on this machine by FILE "
                 "(scripts/calibrate.sh), beside the measured one")
      ->check(cli::InputFile);
  cli::add_checkpoint_options(app, o.checkpoints, /*required=*/false,
                              "Write sharded checkpoints here (one file per rank and an index; on storage every rank "
                              "shares)",
                              "the same world size and stage");
  app.add_option("--consolidate", o.consolidate, "Write the checkpoint in this step folder as one ordinary "
                                                 "safetensors file (--save), without training");
  app.add_flag("--prefetch", o.prefetch, "Stage 3: gather the next unit while this one computes");
  cli::refuse_inert(app, "--prefetch", [&o] {
    return o.stage == 3 || o.compare ? std::string()
                                     : "gathers stage 3's parameters ahead; --stage is " + std::to_string(o.stage) +
                                           " (add --stage 3, or --compare)";
  });
  app.add_flag("--compare", o.compare, "Run stages 0, 1, 2 and 3 one after the other and compare them");
  cli::add_verify_options(app, o.verify, "against the whole model: the averaged gradient, the loss and the update",
                          o.faults, {{"skip-rank-share", "the last rank's share of each step is lost"},
                                     parallel::skewed_share_fault(), truncating_gelu_flag(), ce_next_row_flag()});
  cli::add_kill_options(app, o.kill, cli::kMaxSteps);
}

parallel::ZeroOptions::Offload offload_of(const Options& o) {
  using Offload = parallel::ZeroOptions::Offload;
  return o.offload == "parameters" ? Offload::parameters : o.offload == "optimizer" ? Offload::optimizer : Offload::none;
}

parallel::ZeroOptions zero_options(const Options& o) {
  parallel::ZeroOptions options;
  options.lr = o.training.lr;
  options.beta1 = optim::kGpt2AdamW.beta1, options.beta2 = optim::kGpt2AdamW.beta2;
  options.eps = optim::kGpt2AdamW.eps, options.weight_decay = optim::kGpt2AdamW.weight_decay;
  options.max_grad_norm = o.clip;
  options.precision = o.precision.dtype();
  options.init_scale = o.precision.loss_scale;
  options.offload = offload_of(o);
  return options;
}

void check_options(const Options& o) {
  if (o.offload == "parameters" && (o.stage != 3 || o.compare))
    throw UsageError(std::string("--offload: parameters are offloaded at stage 3 only; ") +
                     (o.compare ? "--compare runs stages 0-2 too (use --offload optimizer)"
                                : "--stage " + std::to_string(o.stage) + " keeps every parameter on every rank"));
  if (o.checkpoints.resume && o.checkpoints.dir.empty())
    throw UsageError("--resume: needs --ckpt-dir, the folder to resume from");
  cli::arm_faults(o.faults, o.verify, o.training.steps);
  refuse_inert_kernel_fault(o.faults.fault, o.models.model == "gpt", o.precision.dtype());
  if (!o.predict.empty()) prediction_calibration(o);  // refused now, not after the runs
  if (o.kill.at_step >= 0 && o.checkpoints.dir.empty())
    throw UsageError("--fail-at-step: a rank killed on purpose is for a run that recovers from --ckpt-dir");
  if (o.compare && (!o.checkpoints.dir.empty() || !o.save.empty()))
    throw UsageError(std::string(o.checkpoints.dir.empty() ? "--save" : "--ckpt-dir") +
                     ": checkpoints are of one stage's run; leave out --compare");
}

void check_options(const Options& o, int ranks) {
  parallel::refuse_inert_skewed_share(o.faults.fault, ranks);
  cli::check_kill_options(o.kill, o.training.steps, o.checkpoints.every, ranks, /*only_rank0_writes=*/false);
}

}  // namespace course::chapter07
