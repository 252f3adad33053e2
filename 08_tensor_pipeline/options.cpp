// Chapter 08's flags and the grid's checks.
#include "08_tensor_pipeline/options.h"

#include <CLI/CLI.hpp>

#include "08_tensor_pipeline/task.h"
#include "common/cli/limits.h"
#include "common/cli/training_options.h"
#include "common/core/errors.h"
#include "common/ops/kernel_faults.h"  // --fault truncating-gelu, ce-next-row
#include "common/parallel/context_parallel.h"  // the lengths and layouts --cp can split
#include "common/parallel/distributed_sampler.h"  // --fault skewed-share

namespace course::chapter08 {

void add_options(CLI::App& app, Options& o) {
  o.models.model = "gpt";
  o.training = {20, 48, 3e-3f};
  o.mlp.samples = 4096;
  o.mlp.layers = 8;
  cli::add_common_options(app, o.common);
  cli::add_distributed_options(app, o.distributed);
  cli::add_model_options(app, o.models);
  cli::add_recompute_option(app, o.models);  // --recompute: the GPT's activations
  cli::add_mlp_options(app, o.mlp);
  cli::add_precision_options(app, o.precision);
  cli::add_reduce_dtype_option(app, o.precision);  // DDP's gradients in 16 bits
  app.add_option("--tp", o.tp, "Tensor-parallel ranks (split every layer)")->check(CLI::Range(1, 1024))->capture_default_str();
  app.add_flag("--sequence-parallel", o.sequence_parallel, "Also split the GPT's layer norms and residual adds along the "
                                                          "sequence (Korthikanti et al. 2022; needs --tp 2 or more)");
  app.add_option("--cp", o.cp, "Context-parallel ranks (split every sequence; attention by --cp-method)")
      ->check(CLI::Range(1, 1024))->capture_default_str();
  app.add_option("--cp-method", o.cp_method, "How attention sees the whole sequence: ring (key-value blocks round a "
                                             "ring, Liu et al. 2023) or ulysses (all-to-all to head shards, Jacobs et al. 2023)")
      ->check(CLI::IsMember({"ring", "ulysses"}))->capture_default_str();
  app.add_option("--pp", o.pp, "Pipeline stages (split the layers)")->check(CLI::Range(1, 1024))->capture_default_str();
  app.add_option("--dp", o.dp, "Data-parallel replicas (0: what the world leaves)")->check(CLI::Range(0, 1 << 20))
      ->capture_default_str();
  app.add_option("--micro-batches", o.micro_batches, "Micro-batches per step on each replica")
      ->check(CLI::Range(1, 4096))->capture_default_str();
  app.add_option("--schedule", o.schedule, "Pipeline schedule: gpipe, 1f1b, interleaved (1F1B over --virtual-stages "
                                           "model chunks per rank) or zero-bubble (ZB-H1: backward split in two, the "
                                           "weights' half filling the idle time)")
      ->check(CLI::IsMember({"gpipe", "1f1b", "interleaved", "zero-bubble"}))->capture_default_str();
  cli::refuse_inert(app, "--schedule", [&o] {
    return o.pp > 1 ? std::string() : "orders a pipeline's micro-batches; --pp is 1 (add --pp 2 or more)";
  });
  cli::refuse_inert(app, "--cp-method", [&o] {
    return o.models.model == "mlp" ? "chooses how attention sees a split sequence; --model mlp has no attention"
           : o.cp == 1             ? "chooses how attention sees a split sequence; --cp is 1 (add --cp 2 or more)"
                                   : "";
  });
  app.add_option("--virtual-stages", o.virtual_stages, "Model chunks per pipeline rank, with --schedule interleaved "
                                                       "(Megatron-LM's virtual pipeline stages)")
      ->check(CLI::Range(1, 64))->capture_default_str();
  cli::add_training_options(app, o.training, "AdamW's peak learning rate");
  app.add_option("--clip", o.clip, "Clip the gradient's global norm (over the whole grid) to this; 0: off")
      ->check(cli::NonNegativeFinite)->capture_default_str();
  app.add_option("--log-every", o.log_every, "Print every N steps")->check(cli::PositiveInteger)->capture_default_str();
  cli::add_sim_network_option(app, o.sim_network);
  cli::add_memory_limit_option(app, o.mem_limit_mb);
  cli::add_verify_options(app, o.verify, "against the unsharded model on the whole global batch: the gradient, the "
                          "loss and the update", o.faults,
                         {{"skip-dp-average", "the replicas never average their gradients"},
                          {"skip-tp-all-reduce", "the TP group's all-reduces never happen"},
                          {"lose-micro-batch", "each step's last micro-batch never runs"},
                          {"skip-tied-exchange", "the first and the last stage never add each other's table gradient"},
                          {"skip-sp-sum", "the sequence-parallel partial gradients are never summed"},
                          {"sp-unsummed-bias", "the last TP rank keeps its own partial gradient of the row-parallel "
                                               "biases, left out of the sequence-parallel sum"},
                          {"sp-average-biases", "the row-parallel biases average their sequence-parallel partial "
                                                "gradients where they should add them"},
                          {"skip-cp-offset", "every context-parallel rank takes the sequence's first tokens as its own"},
                          {"exact-gelu", "the GPT's tensor-parallel MLPs compute the exact GELU where the model uses "
                                         "the tanh form"},
                          {"sp-gather-rows", "the sequence-parallel all-gather puts each rank's rows where the next "
                                             "rank's go"},
                          {"ring-drop-block", "ring attention leaves out the last key-value block to arrive"},
                          {"row-parallel-no-sum", "the row-parallel layers keep each rank's partial output, never summed"},
                          parallel::skewed_share_fault(), truncating_gelu_flag(), ce_next_row_flag(),
                          {"stray-replica", "the last replica's update (of the data- and context-parallel ranks holding "
                                            "the same part) moves its first weight one unit in the last place further"},
                          {"stray-tp-copy", "the last TP rank's update moves its copy of the first parameter every TP "
                                            "rank holds whole (a layer norm's, a row-parallel bias) one unit in the last "
                                            "place further"},
                          {"stray-moment", "as stray-tp-copy with TP, else as stray-replica, the update moving that "
                                           "rank's AdamW first moment of the tensor, not the tensor"}});
  app.add_option("--trace", o.trace, "Write the last step's timeline of every stage here (Chrome trace JSON; with "
                                     "--sweep, FILE's stem and _SCHEDULE.json, each schedule at 4 micro-batches)")
      ->check(cli::OutputFile);
  app.add_flag("--sweep", o.sweep, "Run every schedule at 1, 2, 4, 8 and 16 micro-batches (interleaved where they divide): "
                                   "the bubble and the activations against them, as metrics for scripts/plot.py pipeline");
}

std::int64_t check_grid(const Options& o, const ChapterTask& task, parallel::Topology& topology) {
  const int dp = topology.dp_size(), tp = topology.tp_size();
  const std::string& fault = o.faults.fault;
  parallel::refuse_inert_skewed_share(fault, dp);
  refuse_inert_kernel_fault(fault, task.is_gpt(), o.precision.dtype());
  if (fault == "ce-next-row" && tp > 1)
    throw UsageError("--fault: ce-next-row breaks the unsplit cross-entropy's 16-bit kernel, and --tp " + std::to_string(tp) +
                     " splits the loss over the vocabulary (its own kernels)");
  if (fault == "skip-dp-average" && topology.dp_cp_group().size() < 2)
    throw UsageError("--fault: skip-dp-average needs data or context parallelism (--dp or --cp 2 or more)");
  if (fault == "stray-replica" && topology.dp_cp_group().size() < 2)
    throw UsageError("--fault: stray-replica needs data or context parallelism (--dp or --cp 2 or more)");
  if (fault == "stray-replica" && !o.verify)
    throw UsageError("--fault: stray-replica is caught by --verify's check alone (it compares the replicas): add --verify");
  if (fault == "stray-tp-copy" && tp < 2)
    throw UsageError("--fault: stray-tp-copy needs tensor parallelism (--tp 2 or more)");
  if (fault == "stray-moment" && tp < 2 && topology.dp_cp_group().size() < 2)
    throw UsageError("--fault: stray-moment needs a rank holding what another holds (--tp, --dp or --cp 2 or more)");
  if (fault == "skip-cp-offset" && topology.cp_size() < 2)
    throw UsageError("--fault: skip-cp-offset needs context parallelism (--cp 2 or more)");
  if (fault == "skip-tp-all-reduce" && tp < 2)
    throw UsageError("--fault: skip-tp-all-reduce needs tensor parallelism (--tp 2 or more)");
  if (fault == "lose-micro-batch" && o.micro_batches < 2)
    throw UsageError("--fault: lose-micro-batch needs two or more micro-batches (--micro-batches)");
  if (fault == "lose-micro-batch" && o.schedule == "interleaved")
    throw UsageError("--fault: lose-micro-batch leaves a number of micro-batches interleaved 1F1B cannot run (not a "
                     "multiple of the stages); try skip-tied-exchange, or --schedule 1f1b");
  if (fault == "skip-tied-exchange" && (!task.is_gpt() || topology.pp_size() < 2))
    throw UsageError("--fault: skip-tied-exchange needs the GPT's table on two stages (--pp 2 or more)");
  if (fault == "exact-gelu" && !task.is_gpt())
    throw UsageError("--fault: exact-gelu is a fault of the GPT's blocks; --model is mlp");
  if (fault == "sp-gather-rows" && !o.sequence_parallel)
    throw UsageError("--fault: sp-gather-rows needs --sequence-parallel");
  if (fault == "ring-drop-block" && (!task.is_gpt() || topology.cp_size() < 2))
    throw UsageError("--fault: ring-drop-block needs the GPT's attention over context parallelism (--cp 2 or more)");
  if (fault == "ring-drop-block" && o.cp_method != "ring")
    throw UsageError("--fault: ring-drop-block is a fault of the ring; --cp-method is " + o.cp_method);
  if (fault == "row-parallel-no-sum" && tp < 2)
    throw UsageError("--fault: row-parallel-no-sum needs tensor parallelism (--tp 2 or more)");
  if ((fault == "skip-sp-sum" || fault == "sp-unsummed-bias" || fault == "sp-average-biases") && !o.sequence_parallel)
    throw UsageError("--fault: " + fault + " needs --sequence-parallel");
  const std::int64_t global_batch =
      cli::global_batch_for(o.training, dp, o.micro_batches, task.task.size, "DP", "--micro-batches");
  if (o.sequence_parallel && tp < 2)
    throw UsageError("--sequence-parallel: needs tensor parallelism (--tp 2 or more)");
  if (o.precision.reduce_dtype != "fp32" && topology.dp_cp_group().size() < 2)
    throw UsageError("--reduce-dtype: averages the gradients of data or context parallelism, which this grid has none "
                     "of (--dp or --cp 2 or more)");
  const int pp = topology.pp_size(), v = o.virtual_stages;
  if ((o.schedule == "interleaved") != (v > 1))
    throw UsageError(v > 1 ? "--virtual-stages: " + std::to_string(v) + " chunks per rank need --schedule interleaved"
                           : "--schedule: interleaved needs --virtual-stages 2 or more (model chunks per rank)");
  if (v > 1 && pp < 2) throw UsageError("--virtual-stages: interleaves the stages of a pipeline (--pp 2 or more)");
  if (o.schedule == "zero-bubble" && topology.dp_cp_group().size() > 1)
    throw UsageError("--schedule: zero-bubble leaves the weights' gradients for later, and DDP's buckets wait for them "
                     "at the end of each backward: not with --dp or --cp");
  if (v > 1 && !o.sweep && o.micro_batches % pp != 0)
    throw UsageError("--micro-batches: interleaved 1F1B runs them in groups of the " + std::to_string(pp) +
                     " stages; " + std::to_string(o.micro_batches) + " is not a multiple of " + std::to_string(pp));
  if (v <= 1 && task.is_gpt() && task.config.n_layer % pp != 0)  // refused before the schedule is printed
    throw UsageError("--n-layer: " + std::to_string(task.config.n_layer) + " layers do not divide among " +
                     std::to_string(pp) + " pipeline stages");
  if (v > 1 && task.is_gpt() && task.config.n_layer % (pp * v) != 0)
    throw UsageError("--virtual-stages: " + std::to_string(task.config.n_layer) + " layers do not divide into " +
                     std::to_string(pp) + " stages x " + std::to_string(v) + " chunks (--n-layer a multiple of " +
                     std::to_string(pp * v) + ")");
  if (topology.cp_size() > 1 && o.sequence_parallel)
    throw UsageError("--cp: context parallelism splits every sequence already; not with --sequence-parallel");
  if (!task.is_gpt()) {
    if (topology.cp_size() > 1) throw UsageError("--cp: splits the GPT's sequences; the MLP has none");
    if (topology.pp_size() > 1)
      throw UsageError("--pp: the MLP is split by tensor parallelism only; pipeline stages split the GPT");
    if (o.sequence_parallel) throw UsageError("--sequence-parallel: splits the GPT's sequences; the MLP has none");
    if (o.mlp.hidden % tp != 0)
      throw UsageError("--hidden: " + std::to_string(o.mlp.hidden) + " hidden units do not divide among " +
                       std::to_string(tp) + " tensor-parallel ranks");
    return global_batch;
  }
  if (task.text && topology.cp_size() > 1 &&
      parallel::context_parallel_length(task.sequence, topology.cp_size(), parallel::parse_context_method(o.cp_method)) !=
          task.sequence)
    throw UsageError("--block-size: windows of " + std::to_string(task.sequence) + " characters do not divide among " +
                     std::to_string(topology.cp_size()) + " context-parallel ranks by " + o.cp_method +
                     (o.cp_method == "ring" ? " (a multiple of 2 x --cp)" : " (a multiple of --cp)"));
  if (topology.cp_size() > 1)  // the (padded) sequence and each TP rank's heads among the CP ranks
    parallel::check_context_parallel(task.sequence, task.config.n_head / tp, topology.cp_size(),
                                     parallel::parse_context_method(o.cp_method));
  if (o.sequence_parallel && task.tokens_per_sample() % tp != 0)
    throw UsageError("--sequence-parallel: sequences of " + std::to_string(task.tokens_per_sample()) +
                     " tokens do not divide among " + std::to_string(tp) + " tensor-parallel ranks");
  return global_batch;
}

}  // namespace course::chapter08
