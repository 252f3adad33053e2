// Chapter 08's figures: the step times, the stages' bubbles and peaks, the timeline.
#include "08_tensor_pipeline/report.h"

#include "common/comm/agree.h"  // all_gather_values, all_reduce_scalar: the stages' figures on every rank
#include "common/core/log.h"
#include "common/core/memory.h"
#include "common/metrics/trace.h"
#include "common/parallel/pipeline_schedule.h"
#include "common/parallel/replicas.h"  // on_rank0

namespace course::chapter08 {

void write_timeline(const GridRun& run, const std::string& path, const std::string& label) {
  metrics::ChromeTrace trace;
  trace.label(label);
  const bool chunked = run.stage && run.stage->chunks() > 1;  // interleaved: "F3.1", micro-batch 3 through chunk 1
  for (std::size_t s = 0; s < run.timeline.size(); ++s)
    for (const auto& a : run.timeline[s])
      trace.add(static_cast<int>(s), "stage " + std::to_string(s), parallel::describe(a.action, chunked), a.begin_ms,
                a.end_ms);
  trace.write(path);
  log("timeline: %s (Chrome trace: open it in ui.perfetto.dev, or python3 scripts/plot.py timeline %s PNG)\n",
      path.c_str(), path.c_str());
}

void report_stages(const GridRun& run, int m, const std::string& schedule, metrics::MetricsWriter& metrics,
                   const char* event, const std::string& network) {
  const int p = static_cast<int>(run.bubble.size()), v = run.stage ? run.stage->chunks() : 1;
  const double theory = parallel::bubble_fraction(schedule, p, m, v);
  const char* formula = schedule == "zero-bubble" ? (m >= p ? "(p-1)/(3m+p-1)" : "1-3m/(2m+2p-1)")
                        : v > 1                   ? "(p-1)/(vm+p-1)"
                                                  : "(p-1)/(m+p-1)";
  log("pipeline: %d stages%s, %d micro-batches, %s%s; bubble (idle share of the step) against %s = %.3f:\n", p,
      v > 1 ? (" of " + std::to_string(v) + " chunks each").c_str() : "", m, schedule.c_str(), network.c_str(),
      formula, theory);
  // The theory assumes equal stages and free transfers. Each stage's measured work (a micro-batch's
  // passes, the mean over the steps) put through the same schedule says how much of a stage's distance
  // from the theory its unequal work explains; the rest is the transfers' and the waits' time.
  std::vector<parallel::StageTimes> work = run.work;
  for (auto& w : work) w = {w.forward / m, w.backward / m, w.weight / m};
  const auto simulated = parallel::simulate(parallel::make_schedule(schedule, p, m, v), work).idle_fraction;
  for (int s = 0; s < p; ++s) {
    const auto& mine = work[static_cast<std::size_t>(s)];
    log("  stage %d  bubble %.3f (with the stages' measured work %.3f; a micro-batch's passes %.2f ms)  peak "
        "activations %s\n",
        s, run.bubble[static_cast<std::size_t>(s)], simulated[static_cast<std::size_t>(s)],
        mine.forward + mine.backward + mine.weight,
        format_bytes(static_cast<std::int64_t>(run.peak_activations[static_cast<std::size_t>(s)])).c_str());
    metrics.write({{"event", event}, {"stage", s}, {"stages", p}, {"micro_batches", m}, {"schedule", schedule},
                   {"virtual_stages", v},
                   {"bubble", run.bubble[static_cast<std::size_t>(s)]}, {"theory", theory},
                   {"simulated", simulated[static_cast<std::size_t>(s)]},
                   {"forward_ms", mine.forward}, {"backward_ms", mine.backward}, {"weight_ms", mine.weight},
                   {"peak_activation_bytes", run.peak_activations[static_cast<std::size_t>(s)]},
                   {"simulated_network", network.empty() ? "" : "simulated" + network.substr(network.find(':') + 1)}});
  }
}

void report_context_parallel(const Options& o, const ChapterTask& task, parallel::Topology& topology,
                             const parallel::ContextParallel& cp, std::int64_t bytes_per_step, metrics::MetricsWriter& metrics) {
  // Each of this rank's layers runs attention once per micro-batch, on its TP rank's heads; Ulysses'
  // all-to-alls carry the projection's type (16 bits under autocast), the ring's blocks float32.
  const std::int64_t layers = task.config.n_layer / topology.pp_size();
  const std::int64_t micro = o.training.global_batch / topology.dp_size() / o.micro_batches;
  const bool sixteen = cp.method() == parallel::ContextMethod::ulysses && o.precision.dtype() != DType::float32;
  const std::int64_t formula =
      layers * o.micro_batches *
      cp.bytes_per_attention(micro, task.sequence, task.config.n_embd / topology.tp_size(), sixteen ? 2 : 4,
                             o.models.recompute == "full");
  log("context parallelism (%s, CP %d, %lld tokens each %lld per rank): %s per step to the CP group per rank, formula %s "
      "(%.3f)\n",
      parallel::context_method_name(cp.method()), cp.size(), static_cast<long long>(task.sequence),
      static_cast<long long>(task.sequence / cp.size()), format_bytes(bytes_per_step).c_str(), format_bytes(formula).c_str(),
      formula > 0 ? static_cast<double>(bytes_per_step) / static_cast<double>(formula) : 0.0);
  metrics.write({{"event", "context_parallel"}, {"method", parallel::context_method_name(cp.method())},
                 {"cp", cp.size()}, {"sequence", task.sequence}, {"bytes_per_step", bytes_per_step},
                 {"formula_bytes_per_step", formula}});
}

void log_start(const Options& o, const ChapterTask& task, const parallel::Topology& topology, const std::string& network,
               const std::string& limit) {
  const int dp = topology.dp_size();
  const std::int64_t local_batch = o.training.global_batch / dp, micro = local_batch / o.micro_batches;
  if (task.sequence != task.tokens_per_sample())
    log("context parallelism: sequences of %lld tokens padded to %lld, which %d ranks split (%s); the padding's "
        "targets ignored\n", static_cast<long long>(task.tokens_per_sample()), static_cast<long long>(task.sequence),
        topology.cp_size(), o.cp_method.c_str());
  log("Chapter 08: %s%s; %s; global batch %lld = DP %d x %d micro-batches of %lld%s; %lld steps%s%s%s\n",
      topology.describe().c_str(), o.sequence_parallel ? " with sequence parallelism" : "",
      task.task.description.c_str(), static_cast<long long>(o.training.global_batch), dp, o.micro_batches,
      static_cast<long long>(micro),
      topology.pp_size() > 1 ? (" (" + o.schedule + " schedule" +
                                (o.virtual_stages > 1 ? ", " + std::to_string(o.virtual_stages) + " chunks per rank" : "") + ")")
                                   .c_str()
                             : "",
      static_cast<long long>(o.training.steps),
      (cli::precision_description(o.precision) == "fp32" ? "" : ", " + cli::precision_description(o.precision)).c_str(),
      network.c_str(), limit.c_str());
}

void report_run(const Options& o, const ChapterTask& task, parallel::Topology& topology, const GridRun& run,
                const std::string& network, metrics::MetricsWriter& metrics) {
  if (topology.pp_size() > 1) {
    report_stages(run, o.micro_batches, o.schedule, metrics, "pipeline_stage", network);
  } else {
    log("peak activations: %s per rank\n", format_bytes(static_cast<std::int64_t>(run.peak_activations[0])).c_str());
    metrics.write({{"event", "activations"}, {"peak_activation_bytes", run.peak_activations[0]},
                           {"sequence_parallel", o.sequence_parallel}});
  }
  const std::string grid = topology.describe().substr(0, topology.describe().rfind("-Rank"));
  const double per_step = static_cast<double>(o.training.global_batch * task.tokens_per_sample());
  const char* unit = task.is_gpt() ? "tokens" : "samples";
  log("throughput: %.0f %s/s (step %.2f ms, the slowest rank's mean after the first%s)\n", per_step / (run.step_ms / 1000.0),
      unit, run.step_ms, network.c_str());
  if (run.cp) report_context_parallel(o, task, topology, *run.cp, run.cp_bytes, metrics);
  if (o.precision.dtype() == DType::float16)
    log("fp16: %lld of %lld steps skipped for gradients that overflowed (the loss scale halved at each)\n",
        static_cast<long long>(run.skipped_steps), static_cast<long long>(o.training.steps));
  metrics.write({{"event", "throughput"}, {"grid", grid}, {"sequence_parallel", o.sequence_parallel},
                         {"precision", o.precision.precision}, {"reduce_dtype", o.precision.reduce_dtype}, {"skipped_steps", run.skipped_steps},
                         {"recompute", o.models.recompute}, {"peak_activation_bytes", run.peak_activations},  // per stage
                         {"final_loss", run.losses.empty() ? 0.0f : run.losses.back()},
                         {std::string(unit) + "_per_s", per_step / (run.step_ms / 1000.0)}, {"step_ms", run.step_ms},
                         {"simulated_network", network.empty() ? "" : "simulated " + o.sim_network}});
  if (!o.trace.empty())  // rank 0 writes; a full disk ends every rank alike, with one line
    parallel::on_rank0(topology.world(), [&] {
      write_timeline(run, o.trace, grid + ", " + (topology.pp_size() > 1 ? o.schedule + ", " : std::string()) +
                                       std::to_string(o.micro_batches) + " micro-batches: the last step" + network);
    });
}

void StepFigures::begin_step() { begin_ = std::chrono::steady_clock::now(); }

void StepFigures::end_step(std::int64_t step, const parallel::PipelineStep& result, double checked_ms) {
  if (step > 0 || steps_ == 1) {  // the first step warms up allocators
    pipeline_ms_ += result.step_ms;
    for (const auto& a : result.timeline) {
      busy_ms_ += a.end_ms - a.begin_ms;
      (a.action.op == parallel::PipeOp::forward    ? work_ms_.forward
       : a.action.op == parallel::PipeOp::backward ? work_ms_.backward
                                                   : work_ms_.weight) += a.end_ms - a.begin_ms;
    }
    whole_ms_ += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - begin_).count() - checked_ms;
  }
  peak_ = std::max(peak_, result.peak_activation_bytes);
  last_ = result.timeline;
}

void StepFigures::finish(GridRun& run, parallel::Topology& topology) const {
  // Each stage's figures, from its first TP rank of the first replica, gathered on every rank: [the rank
  // speaks for its stage (1 or 0), the stage, bubble, peak, its forwards', backwards' and W's time in a
  // step, then per action: op, micro-batch, chunk, begin, end].
  const bool speaks = topology.tp_rank() == 0 && topology.dp_rank() == 0 && topology.cp_rank() == 0;
  const auto timed = static_cast<double>(std::max<std::int64_t>(1, steps_ - 1));  // the steps end_step summed
  std::vector<double> mine = {speaks ? 1.0 : 0.0, static_cast<double>(topology.pp_rank()),
                              pipeline_ms_ > 0 ? 1.0 - busy_ms_ / pipeline_ms_ : 0.0, static_cast<double>(peak_),
                              work_ms_.forward / timed, work_ms_.backward / timed, work_ms_.weight / timed};
  for (const auto& timed : last_)
    mine.insert(mine.end(), {static_cast<double>(static_cast<int>(timed.action.op)),  // forward, backward, weight
                             static_cast<double>(timed.action.micro_batch), static_cast<double>(timed.action.chunk),
                             timed.begin_ms, timed.end_ms});
  const auto all = comm::all_gather_values(topology.world(), mine);
  const double mean_ms = whole_ms_ / static_cast<double>(std::max<std::int64_t>(1, steps_ - 1));
  run.step_ms = comm::all_reduce_scalar(topology.world(), static_cast<float>(mean_ms), comm::ReduceOp::max);  // the slowest
  const auto p = static_cast<std::size_t>(topology.pp_size());
  run.bubble.assign(p, 0.0), run.peak_activations.assign(p, 0.0), run.timeline.assign(p, {});
  run.work.assign(p, {0.0, 0.0, 0.0});
  for (const auto& figures : all) {
    if (figures[0] == 0.0) continue;
    const auto s = static_cast<std::size_t>(figures[1]);
    run.bubble[s] = figures[2], run.peak_activations[s] = figures[3];
    run.work[s] = {figures[4], figures[5], figures[6]};
    for (std::size_t at = 7; at + 5 <= figures.size(); at += 5)
      run.timeline[s].push_back({{static_cast<parallel::PipeOp>(static_cast<int>(figures[at])), static_cast<int>(figures[at + 1]),
                                  static_cast<int>(figures[at + 2])},
                                 figures[at + 3], figures[at + 4]});
  }
}

}  // namespace course::chapter08
