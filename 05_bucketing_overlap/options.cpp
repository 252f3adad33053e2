// Chapter 05's flags.
#include "05_bucketing_overlap/options.h"

#include <CLI/CLI.hpp>

#include "05_bucketing_overlap/prediction.h"
#include "common/core/errors.h"
#include "common/ops/kernel_faults.h"  // --fault truncating-gelu, ce-next-row
#include "common/parallel/distributed_sampler.h"  // --fault skewed-share

namespace course::chapter05 {

void add_options(CLI::App& app, Options& o) {
  o.training = {8, 128, 0.001f};
  o.mlp.samples = 4096;
  o.mlp.features = 64;
  o.mlp.hidden = 1024;
  o.mlp.layers = 8;
  cli::add_common_options(app, o.common);
  cli::add_distributed_options(app, o.distributed);
  cli::add_save_option(app, o.save);
  cli::add_training_options(app, o.training, "SGD learning rate");
  cli::add_precision_options(app, o.precision);
  cli::add_mlp_options(app, o.mlp);
  cli::add_model_options(app, o.models);
  app.add_option("--bucket-mb", o.bucket_mb, "Bucket cap in MiB (PyTorch's bucket_cap_mb, which counts MiB too: 25 there, for models of GBs)")
      ->check(cli::PositiveFinite & CLI::Range(0.0, 1e6))
      ->capture_default_str();
  app.add_option("--first-bucket-mb", o.first_bucket_mb, "Cap of the first bucket in MiB")
      ->check(cli::PositiveFinite & CLI::Range(0.0, 1e6))
      ->capture_default_str();
  cli::add_sim_network_option(app, o.sim_network);
  app.add_option("--trace", o.trace, "Write the timeline of the last overlapped step here (Chrome trace JSON)")
      ->check(cli::OutputFile)->capture_default_str();
  app.add_option("--comm-hook", o.comm_hook, "How buckets travel: none (float32), fp16 or bf16 (half the bytes)")
      ->check(CLI::IsMember({"none", "fp16", "bf16"}))
      ->capture_default_str();
  app.add_option("--predict", o.predict,
                 "Price each mode with the course's cost model, calibrated on this machine by FILE (benchmarks/plan "
                 "--calibrate), beside its measured step")
      ->check(cli::InputFile);
  app.add_flag("--sweep-buckets", o.sweep_buckets, "Also time buckets+overlap at caps from 0.25 to 100 MB");
  cli::add_verify_options(app, o.verify, "every mode against one rank", o.faults,
                         {{"skip-bucket", "the first bucket of each backward is never all-reduced"},
                          {"launch-early", "the first bucket is launched before its last gradient is in"},
                          {"step-early", "the optimizer steps before the last bucket's average lands"},
                          parallel::skewed_share_fault(), truncating_gelu_flag(), ce_next_row_flag(),
                          {"truncating-hook", "--comm-hook bf16 converts by dropping the low 16 bits (truncation) "
                                              "instead of rounding to nearest"}});
}

void check_options(const Options& o) {
  if (o.training.steps < 2)
    throw UsageError("--steps: " + std::to_string(o.training.steps) + " leaves no step to time (the first is not timed)");
  cli::arm_faults(o.faults, o.verify, o.training.steps);
  refuse_inert_kernel_fault(o.faults.fault, o.models.model == "gpt", o.precision.dtype());
  if (o.faults.fault == "truncating-hook" && o.comm_hook != "bf16")
    throw UsageError("--fault: truncating-hook is a fault of --comm-hook bf16's conversion; --comm-hook is " + o.comm_hook);
  if (!o.predict.empty()) prediction_calibration(o);  // refused now, not after the runs
}

}  // namespace course::chapter05
