// Chapter 08: when the model does not fit on one device, split it. Tensor parallelism splits every
// layer across the ranks of a TP group (Megatron-LM: attention's heads, the MLP's hidden units, the
// vocabulary; common/parallel/tensor_parallel_gpt.h), and with --sequence-parallel the rest of each
// block along the sequence; pipeline parallelism splits the layers into stages that pass micro-batches
// along (GPipe or 1F1B; common/parallel/pipeline.h); data parallelism runs copies of the whole
// arrangement and averages their gradients over the DP group only. The topology
// (common/parallel/topology.h) owns the TP x PP x DP grid; nothing here computes a rank. The run is in
// grid_training.cpp; --verify (verify_grid.cpp) checks every step in lock-step against the unsharded
// model on the whole global batch: the grid's gradient, its loss and its update.
#include "common/cli/session.h"                    // device, topology (the grid) and metrics
#include "common/comm/environment.h"               // MPI start-up
#include "common/comm/simulated_network.h"         // --sim-network: an alpha-beta delay per message
#include "common/core/log.h"                       // rank 0 prints
#include "common/metrics/charts.h"                 // the charts, through scripts/plot.py
#include "common/metrics/trace.h"                  // the timeline as Chrome trace JSON
#include "common/parallel/replicas.h"              // on_rank0
#include "grid_training.h"                         // Options, one training run on the grid
#include "verify_grid.h"                           // --verify

using namespace course;
using namespace course::chapter08;

namespace {

// The last step of every stage as a Chrome trace (one row per stage), and as a PNG beside it.
void write_timeline(const GridRun& run, const std::string& path, const std::string& label) {
  metrics::ChromeTrace trace;
  trace.label(label);
  for (std::size_t s = 0; s < run.timeline.size(); ++s)
    for (const auto& a : run.timeline[s]) {
      std::string name(1, a.action.op == parallel::PipeOp::forward ? 'F' : 'B');
      name += std::to_string(a.action.micro_batch);
      trace.add(static_cast<int>(s), "stage " + std::to_string(s), name, a.begin_ms, a.end_ms);
    }
  trace.write(path);
  std::string why;
  const std::string png = path.substr(0, path.rfind('.')) + ".png";
  if (metrics::draw_timeline(path, png, &why))
    log("timeline: %s (Chrome trace, opens in Perfetto) and %s\n", path.c_str(), png.c_str());
  else
    log("timeline: %s (Chrome trace, opens in Perfetto); no PNG: %s\n", path.c_str(), why.c_str());
}

// `network`: ", simulated network: ..." when --sim-network is on, for every line that shows a time.
void report_stages(const GridRun& run, int m, const std::string& schedule, metrics::MetricsWriter& metrics,
                   const char* event, const std::string& network) {
  const int p = static_cast<int>(run.bubble.size());
  const double theory = parallel::bubble_fraction(p, m);
  log("pipeline: %d stages, %d micro-batches, %s%s; bubble (idle share of the step) against (p-1)/(m+p-1) = %.3f:\n", p,
      m, schedule.c_str(), network.c_str(), theory);
  for (int s = 0; s < p; ++s) {
    log("  stage %d  bubble %.3f  peak activations %s\n", s, run.bubble[static_cast<std::size_t>(s)],
        format_bytes(static_cast<std::int64_t>(run.peak_activations[static_cast<std::size_t>(s)])).c_str());
    metrics.write({{"event", event}, {"stage", s}, {"stages", p}, {"micro_batches", m}, {"schedule", schedule},
                   {"bubble", run.bubble[static_cast<std::size_t>(s)]}, {"theory", theory},
                   {"peak_activation_bytes", run.peak_activations[static_cast<std::size_t>(s)]}});
  }
}

// --sweep: both schedules at m = 1, 2, 4, 8 and 16, their bubbles against the theory and their
// activations; the charts, and each schedule's timeline at 4 micro-batches.
int sweep(const Options& o, const ChapterTask& task, parallel::Topology& topology, Device device,
          metrics::MetricsWriter& metrics, const std::string& network) {
  const std::vector<int> counts = {1, 2, 4, 8, 16};
  if (o.global_batch % (static_cast<std::int64_t>(topology.dp_size()) * 16) != 0)
    throw UsageError("--global-batch: --sweep runs up to 16 micro-batches per replica, so " +
                     std::to_string(o.global_batch) + " must divide by DP x 16 (" +
                     std::to_string(topology.dp_size() * 16) + ")");
  std::vector<nlohmann::json> records;
  for (const std::string schedule : {"gpipe", "1f1b"})
    for (int m : counts) {
      GridRun run = train_grid(o, task, topology, device, schedule, m, nullptr);
      const int p = topology.pp_size();
      for (int s = 0; s < p; ++s)
        records.push_back({{"event", "pipeline_sweep"}, {"stage", s}, {"stages", p}, {"micro_batches", m},
                           {"schedule", schedule}, {"bubble", run.bubble[static_cast<std::size_t>(s)]},
                           {"theory", parallel::bubble_fraction(p, m)},
                           {"peak_activation_bytes", run.peak_activations[static_cast<std::size_t>(s)]},
                           {"simulated_network", network.empty() ? "" : "simulated " + o.sim_network}});
      report_stages(run, m, schedule, metrics, "pipeline_sweep", network);
      if (m == 4 && topology.rank() == 0)
        write_timeline(run, o.charts + "_timeline_" + schedule + ".json",
                       schedule + ", " + std::to_string(p) + " stages, 4 micro-batches: the last step" + network);
    }
  parallel::on_rank0(topology.world(), [&] {
    std::string why;
    if (metrics::draw_charts("pipeline", records, o.charts, &why))
      log("charts: %s_bubble.png, %s_activations.png\n", o.charts.c_str(), o.charts.c_str());
    else
      log("charts: not drawn: %s\n", why.c_str());
  });
  log("PASSED\n");
  return 0;
}

// The grid and the model must fit each other; each mismatch is one line naming the flag.
void check_grid(const Options& o, const ChapterTask& task, parallel::Topology& topology) {
  const int dp = topology.dp_size(), tp = topology.tp_size();
  const std::string& fault = o.faults.fault;
  if (fault == "skip-dp-average" && dp < 2)
    throw UsageError("--fault: skip-dp-average needs data parallelism (--dp 2 or more)");
  if (fault == "skip-tp-all-reduce" && tp < 2)
    throw UsageError("--fault: skip-tp-all-reduce needs tensor parallelism (--tp 2 or more)");
  if (fault == "lose-micro-batch" && o.micro_batches < 2)
    throw UsageError("--fault: lose-micro-batch needs two or more micro-batches (--micro-batches)");
  if (fault == "skip-tied-exchange" && (!task.is_gpt() || topology.pp_size() < 2))
    throw UsageError("--fault: skip-tied-exchange needs the GPT's table on two stages (--pp 2 or more)");
  if (fault == "skip-sp-sum" && !o.sequence_parallel)
    throw UsageError("--fault: skip-sp-sum needs --sequence-parallel");
  if (o.global_batch % (static_cast<std::int64_t>(dp) * o.micro_batches) != 0)
    throw UsageError("--global-batch: " + std::to_string(o.global_batch) + " is not divisible by DP x --micro-batches (" +
                     std::to_string(dp) + " x " + std::to_string(o.micro_batches) + ")");
  if (o.sequence_parallel && tp < 2)
    throw UsageError("--sequence-parallel: needs tensor parallelism (--tp 2 or more)");
  if (!task.is_gpt()) {
    if (topology.pp_size() > 1)
      throw UsageError("--pp: the MLP is split by tensor parallelism only; pipeline stages split the GPT");
    if (o.sequence_parallel) throw UsageError("--sequence-parallel: splits the GPT's sequences; the MLP has none");
    if (o.hidden % tp != 0)
      throw UsageError("--hidden: " + std::to_string(o.hidden) + " hidden units do not divide among " +
                       std::to_string(tp) + " tensor-parallel ranks");
    return;
  }
  if (o.sequence_parallel && task.tokens_per_sample() % tp != 0)
    throw UsageError("--sequence-parallel: sequences of " + std::to_string(task.tokens_per_sample()) +
                     " tokens do not divide among " + std::to_string(tp) + " tensor-parallel ranks");
}

int run(const Options& o, cli::Session& session) {
  // --sim-network: the same grid over a world whose every message takes at least the alpha-beta time
  // (chapter 05's decorator), so each group, TP, PP and DP, pays it on its own link.
  std::unique_ptr<parallel::Topology> simulated;
  std::string network;  // ", simulated network: alpha 10 us, 1.25 GB/s"
  if (!o.sim_network.empty()) {
    const auto model = comm::parse_network(o.sim_network);
    comm::Communicator& world = session.topology->world();
    simulated = std::make_unique<parallel::Topology>(comm::simulate_network(world.split(0, world.rank()), model),
                                                     parallel::GridShape{o.tp, o.pp, o.dp});
    network = ", simulated network: " + comm::describe(model);
  }
  parallel::Topology& topology = simulated ? *simulated : *session.topology;
  const Device device = session.device;
  const int dp = topology.dp_size();
  const ChapterTask task = make_task(o, device);
  check_grid(o, task, topology);
  const std::int64_t local_batch = o.global_batch / dp, micro = local_batch / o.micro_batches;
  log("Chapter 08: %s%s; %s; global batch %lld = DP %d x %d micro-batches of %lld%s; %lld steps%s\n",
      topology.describe().c_str(), o.sequence_parallel ? " with sequence parallelism" : "",
      task.task.description.c_str(), static_cast<long long>(o.global_batch), dp, o.micro_batches,
      static_cast<long long>(micro), topology.pp_size() > 1 ? (" (" + o.schedule + " schedule)").c_str() : "",
      static_cast<long long>(o.steps), network.c_str());
  if (o.sweep) {
    if (topology.pp_size() < 2) throw UsageError("--sweep: needs a pipeline (--pp 2 or more)");
    return sweep(o, task, topology, device, session.metrics, network);
  }
  if (topology.pp_size() > 1)
    log("%s", parallel::describe(parallel::make_schedule(o.schedule, topology.pp_size(), o.micro_batches)).c_str());
  cli::check_fault_options(o.faults, o.steps);
  GridRun run = train_grid(o, task, topology, device, o.schedule, o.micro_batches, &session.metrics, o.verify);
  if (topology.pp_size() > 1) {
    report_stages(run, o.micro_batches, o.schedule, session.metrics, "pipeline_stage", network);
  } else {
    log("peak activations: %s per rank\n", format_bytes(static_cast<std::int64_t>(run.peak_activations[0])).c_str());
    session.metrics.write({{"event", "activations"}, {"peak_activation_bytes", run.peak_activations[0]},
                           {"sequence_parallel", o.sequence_parallel}});
  }
  const std::string grid = topology.describe().substr(0, topology.describe().rfind("-Rank"));
  const double per_step = static_cast<double>(o.global_batch * task.tokens_per_sample());
  const char* unit = task.is_gpt() ? "tokens" : "samples";
  log("throughput: %.0f %s/s (step %.2f ms, the slowest rank's mean after the first%s)\n", per_step / (run.step_ms / 1000.0),
      unit, run.step_ms, network.c_str());
  session.metrics.write({{"event", "throughput"}, {"grid", grid}, {"sequence_parallel", o.sequence_parallel},
                         {std::string(unit) + "_per_s", per_step / (run.step_ms / 1000.0)}, {"step_ms", run.step_ms},
                         {"simulated_network", network.empty() ? "" : "simulated " + o.sim_network}});
  if (!o.trace.empty() && topology.rank() == 0)
    write_timeline(run, o.trace, grid + ", " + (topology.pp_size() > 1 ? o.schedule + ", " : std::string()) +
                                     std::to_string(o.micro_batches) + " micro-batches: the last step" + network);
  const bool passed = !o.verify || report_check(run.check, task, session.metrics);
  log("%s\n", passed ? "PASSED" : "FAILED");
  return passed ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  comm::Environment env(argc, argv);
  CLI::App app{"Chapter 08: tensor, sequence and pipeline parallelism, with data parallelism on top"};
  Options o;
  o.models.model = "gpt";
  cli::add_common_options(app, o.common);
  cli::add_distributed_options(app, o.distributed);
  cli::add_model_options(app, o.models);
  app.add_option("--hidden", o.hidden, "The MLP's width (--model mlp)")->check(CLI::Range(1, 1 << 14))->capture_default_str();
  app.add_option("--layers", o.layers, "The MLP's hidden layers (--model mlp)")->check(CLI::Range(1, 64))->capture_default_str();
  app.add_option("--tp", o.tp, "Tensor-parallel ranks (split every layer)")->check(CLI::Range(1, 1024))->capture_default_str();
  app.add_flag("--sequence-parallel", o.sequence_parallel, "Also split the GPT's layer norms and residual adds along the "
                                                          "sequence (Korthikanti et al. 2022; needs --tp 2 or more)");
  app.add_option("--pp", o.pp, "Pipeline stages (split the layers)")->check(CLI::Range(1, 1024))->capture_default_str();
  app.add_option("--dp", o.dp, "Data-parallel replicas (0: what the world leaves)")->check(CLI::Range(0, 1 << 20))
      ->capture_default_str();
  app.add_option("--micro-batches", o.micro_batches, "Micro-batches per step on each replica")
      ->check(CLI::Range(1, 4096))->capture_default_str();
  app.add_option("--schedule", o.schedule, "Pipeline schedule: gpipe or 1f1b")
      ->check(CLI::IsMember({"gpipe", "1f1b"}))->capture_default_str();
  app.add_option("--steps", o.steps, "Optimizer steps")
      ->check(cli::PositiveInteger & CLI::Range(std::int64_t{1}, std::int64_t{1000000}))->capture_default_str();
  app.add_option("--global-batch", o.global_batch, "Samples per optimizer step, over all replicas")
      ->check(cli::PositiveInteger & CLI::Range(std::int64_t{1}, std::int64_t{1} << 20))->capture_default_str();
  app.add_option("--lr", o.lr, "AdamW's peak learning rate")->check(cli::PositiveFinite)->capture_default_str();
  app.add_option("--clip", o.clip, "Clip the gradient's global norm (over the whole grid) to this; 0: off")
      ->check(cli::NonNegativeFinite)->capture_default_str();
  app.add_option("--log-every", o.log_every, "Print every N steps")->check(cli::PositiveInteger)->capture_default_str();
  cli::add_sim_network_option(app, o.sim_network);
  app.add_flag("--verify", o.verify, "Check every step in lock-step against the unsharded model on the whole global "
                                     "batch: the gradient, the loss and the update");
  cli::add_fault_options(app, o.faults,
                         {{"skip-dp-average", "the replicas never average their gradients"},
                          {"skip-tp-all-reduce", "the TP group's all-reduces never happen"},
                          {"lose-micro-batch", "each step's last micro-batch never runs"},
                          {"skip-tied-exchange", "the first and the last stage never add each other's table gradient"},
                          {"skip-sp-sum", "the sequence-parallel partial gradients are never summed"}});
  app.add_option("--trace", o.trace, "Write the last step's timeline of every stage here (Chrome trace JSON) and a "
                                     "PNG beside it")->check(cli::OutputFile);
  app.add_flag("--sweep", o.sweep, "Run both schedules at 1, 2, 4, 8 and 16 micro-batches and draw the bubble and the "
                                   "activations against them");
  app.add_option("--charts", o.charts, "With --sweep: PREFIX_bubble.png, PREFIX_activations.png and the timelines")
      ->check(cli::OutputFile)->capture_default_str();
  return cli::run(app, argc, argv, [&] {
    if (!o.models.data.empty()) throw UsageError("--data: chapter 08 trains on the addition task only");
    auto session = cli::start_session(o.common, o.distributed, parallel::GridShape{o.tp, o.pp, o.dp});
    return run(o, session);
  });
}
