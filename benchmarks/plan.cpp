// The planner on the command line: every configuration of a GPT on a cluster of DGX nodes, those that fit
// ranked by predicted throughput, the others counted by why they cannot run; with --published, the
// planner's predictions of Megatron-LM 2021's table 1 beside the paper's figures. On this machine:
// --calibrate measures it (common/planner/calibration.h) and --calibration prices one configuration of
// a GPT of --shape on its ranks (benchmarks/course_prediction.py compares with the chapters' runs).
//   plan [--model gpt3-175b] [--cluster dgx-a100] [--gpus 1024] [--global-batch 1536] [--precision bf16]
//        [--top 10] [--paper-techniques] [--published] [--metrics FILE]
//   plan --calibrate OUT.json --link 03_METRICS.jsonl
//   plan --calibration FILE --mlp FEATURES,HIDDEN,LAYERS --grid DP,1,1,1 --global-batch B   (chapter 04's MLP)
//   plan --calibration FILE --shape L,H,A,S,V --grid DP,TP,PP,CP [--micro-batch 1] [--zero 0]
//        [--recompute none] [--sequence-parallel] [--virtual-stages 1] [--global-batch] [--precision]
// scripts/plot.py plan FILE OUT.png draws the ranked configurations' step time and memory.
#include <cstdio>
#include <map>

#include <CLI/CLI.hpp>

#include "common/checkpoint/safetensors.h"  // write_file_atomically
#include "common/cli/cli.h"
#include "common/metrics/metrics.h"
#include "common/planner/calibration.h"
#include "common/planner/search.h"

#include <fstream>

using namespace course;
using namespace course::planner;

namespace {

constexpr double kGiB = 1ull << 30;

// GPT-3 (Brown et al. 2020) with Megatron-LM's vocabulary, and the models of Megatron-LM 2021's table 1.
std::map<std::string, GptShape> known_models() {
  std::map<std::string, GptShape> models{{"gpt3-175b", {96, 12288, 96, 2048, 51200}}};
  for (const auto& row : megatron_2021_table1()) {
    char name[32];
    std::snprintf(name, sizeof name, "megatron-%gb", row.billions);
    models[name] = row.shape;
  }
  return models;
}

nlohmann::json to_json(const Prediction& p, int rank) {
  const auto& c = p.config;
  return {{"event", "plan"},
          {"rank", rank},
          {"config", describe(c)},
          {"dp", c.dp}, {"tp", c.tp}, {"pp", c.pp}, {"cp", c.cp},
          {"zero_stage", c.zero_stage},
          {"recompute", nn::recompute_name(c.recompute)},
          {"sequence_parallel", c.sequence_parallel},
          {"micro_batch", c.micro_batch},
          {"virtual_stages", c.virtual_stages},
          {"micro_batches", p.micro_batches},
          {"step_seconds", p.time.total()},
          {"compute_seconds", p.time.compute}, {"tp_seconds", p.time.tp}, {"cp_seconds", p.time.cp},
          {"pp_seconds", p.time.pp}, {"dp_seconds", p.time.dp}, {"bubble_seconds", p.time.bubble},
          {"optimizer_seconds", p.time.optimizer},
          {"parameters_bytes", p.memory.parameters}, {"gradients_bytes", p.memory.gradients},
          {"optimizer_bytes", p.memory.optimizer}, {"activations_bytes", p.memory.activations},
          {"buffers_bytes", p.memory.buffers},
          {"tokens_per_second", p.tokens_per_second},
          {"tflops_per_gpu", p.tflops_per_gpu},
          {"mfu", p.mfu}};
}

// One published run beside the planner's prediction, printed and written; its relative error.
double print_published_row(const PublishedRun& row, metrics::MetricsWriter& metrics) {
  const Prediction p = predict_published(row);
  const double error = p.tflops_per_gpu / row.tflops_per_gpu - 1;
  std::printf("%8.1fB %5d %4d %4d %6d  %6.0f TF/s %6.1f TF/s %+6.1f%%  %s\n", row.billions, row.gpus, row.tp, row.pp,
              row.batch, row.tflops_per_gpu, p.tflops_per_gpu, 100 * error, describe(p.config).c_str());
  metrics.write({{"event", "plan_published"}, {"billions", row.billions}, {"gpus", row.gpus},
                 {"published_tflops_per_gpu", row.tflops_per_gpu}, {"predicted_tflops_per_gpu", p.tflops_per_gpu},
                 {"config", describe(p.config)}});
  return error;
}

void print_published(metrics::MetricsWriter& metrics) {
  std::printf("Megatron-LM 2021, table 1, against the planner (DGX A100 nodes, bf16, full recomputation; the "
              "micro-batch and interleaving that run fastest):\n");
  std::printf("%9s %5s %4s %4s %6s  %10s %10s %7s  %s\n", "params", "GPUs", "TP", "PP", "batch", "published",
              "predicted", "error", "configuration");
  double worst = 0;
  for (const auto& row : megatron_2021_table1()) worst = std::max(worst, std::abs(print_published_row(row, metrics)));
  std::printf("largest error %.1f%%\n", 100 * worst);
  std::printf("Table 2, GPT-3 175B in the paper's grid (batch 1536):\n");
  for (const auto& row : megatron_2021_table2_gpt3()) print_published_row(row, metrics);
  const PublishedSweep& sweep = megatron_2021_figure13();
  std::printf("Figure 13, %.1fB on %d GPUs, every TP x PP (the paper's fastest: TP %d x PP %d), predicted TFLOP/s per GPU:\n",
              sweep.billions, sweep.gpus, sweep.fastest_tp, sweep.fastest_pp);
  for (int batch : sweep.batches) {
    std::printf("  batch %4d:", batch);
    for (int tp : sweep.tp) {
      const Prediction p = predict_fastest(sweep.shape, batch, tp, sweep.gpus / tp, sweep.gpus);
      if (p.rejected.empty())
        std::printf("  TP %d x PP %d %.1f", tp, sweep.gpus / tp, p.tflops_per_gpu);
      else
        std::printf("  TP %d x PP %d (%s)", tp, sweep.gpus / tp, p.rejected.substr(0, p.rejected.find(':')).c_str());
    }
    std::printf("\n");
  }
}

// The most ranks a plan of this machine takes: far more than any machine's cores, far below an int's overflow.
constexpr long long kMostRanksHere = 1 << 16;

// --calibration with --mlp: chapter 04's MLP data parallel on this machine, one step priced and written.
int price_mlp(const CLI::App& app, const MlpShape& shape, const Calibration& c, const ParallelConfig& grid,
              double global_batch, int threads, const std::string& metrics_path) {
  if (grid.tp * grid.pp * grid.cp != 1)
    throw UsageError("--grid: the MLP runs data parallel only (N,1,1,1), not " + describe(grid));
  for (const char* flag : {"--micro-batch", "--zero", "--recompute", "--sequence-parallel", "--virtual-stages", "--precision"})
    if (app.count(flag) > 0) throw UsageError(std::string(flag) + ": prices a GPT's configuration; --mlp takes none");
  const Cluster cluster = this_machine(c, grid.dp, threads);
  const TimeBreakdown t = predict_mlp_step(shape, global_batch, grid.dp, cluster).time;
  std::printf("MLP %lld-%lldx%d-1 DP(%d), global batch %.0f, on %s: step %.3f ms (compute %.3f, DP %.3f, optimizer %.3f)\n",
              static_cast<long long>(shape.features), static_cast<long long>(shape.hidden), shape.layers, grid.dp,
              global_batch, cluster.name.c_str(), 1e3 * t.total(), 1e3 * t.compute, 1e3 * t.dp, 1e3 * t.optimizer);
  metrics::MetricsWriter metrics(metrics_path);
  metrics.write({{"event", "plan"}, {"model", "mlp"}, {"dp", grid.dp}, {"global_batch", global_batch},
                 {"step_seconds", t.total()}, {"compute_seconds", t.compute}, {"dp_seconds", t.dp},
                 {"optimizer_seconds", t.optimizer}});
  return 0;
}

// Chapter 03's alpha-beta fit from its metrics (the last alpha_beta line).
Link read_link(const std::string& path) {
  std::ifstream in(path);
  nlohmann::json fit;
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_discarded() && j.is_object() && j.value("event", "") == "alpha_beta") fit = j;
  }
  if (fit.is_null())
    throw UsageError("--link: " + path + " has no alpha_beta line (run 03_collectives on 2 or more ranks with --metrics)");
  const double alpha = fit.value("alpha_us", -1.0) * 1e-6, beta = fit.value("beta_s_per_byte", 0.0);
  // A busy machine can tilt the least-squares line: a latency or a cost per byte below zero prices nothing.
  if (!(alpha >= 0) || !(beta > 0)) {
    char figures[96];
    std::snprintf(figures, sizeof figures, "alpha %.3g us, beta %.3g s a byte", alpha * 1e6, beta);
    throw UsageError("--link: " + path + "'s alpha-beta fit is not a link (" + figures +
                     "): the machine was too busy for it; run 03 again");
  }
  return {alpha, 1 / beta};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"The planner: a GPT's configurations on a cluster of DGX nodes, ranked by predicted throughput"};
  const auto models = known_models();
  std::vector<std::string> names;
  for (const auto& [name, shape] : models) names.push_back(name);
  std::string model = "gpt3-175b", cluster_name = "dgx-a100", precision = "bf16", metrics_path;
  int gpus = 1024, top = 10;
  double global_batch = 1536;
  bool paper_techniques = false, published = false;
  app.add_option("--model", model, "The GPT to plan")->check(CLI::IsMember(names))->capture_default_str();
  app.add_option("--cluster", cluster_name, "DGX nodes of 8 A100s (80 GB) or 8 H100s (common/planner/cluster.h)")
      ->check(CLI::IsMember({"dgx-a100", "dgx-h100"}))
      ->capture_default_str();
  app.add_option("--gpus", gpus, "GPUs, 8 a node (a multiple of 8)")
      ->check(CLI::Range(8, 1 << 20))
      ->capture_default_str();
  app.add_option("--global-batch", global_batch, "Sequences per iteration")
      ->check(cli::PositiveFinite & CLI::Range(1.0, 1e7))
      ->capture_default_str();
  app.add_option("--precision", precision, "bf16 | fp16 (float32 masters) | fp32")
      ->check(CLI::IsMember({"bf16", "fp16", "fp32"}))
      ->capture_default_str();
  app.add_option("--top", top, "Configurations to print")->check(CLI::Range(1, 1000))->capture_default_str();
  app.add_flag("--paper-techniques", paper_techniques,
               "Only what Megatron-LM 2021 had: TP, PP with interleaving, DP, full recomputation");
  app.add_flag("--published", published,
               "Also print Megatron-LM 2021's table 1, table 2's GPT-3 rows and figure 13's sweep against the planner's "
               "predictions");
  app.add_option("--metrics", metrics_path, "Write every printed configuration as a JSON line to FILE")
      ->check(cli::OutputFile);
  // This machine.
  std::string calibrate, link_path, calibration_path;
  std::vector<int> shape, grid, mlp;
  ParallelConfig one;
  std::string recompute = "none";
  app.add_option("--calibrate", calibrate, "Measure this machine and write its calibration (JSON) to FILE")
      ->check(cli::OutputFile);
  int threads = 1;
  app.add_option("--link", link_path,
                 "Chapter 03's metrics (03_collectives --metrics), its alpha-beta fit: with --calibrate the link to "
                 "keep, with --calibration one measured with as many ranks as the grid's (it replaces the kept one)")
      ->check(cli::InputFile);
  app.add_option("--calibration", calibration_path, "Price one configuration on this machine, calibrated by FILE")
      ->check(cli::InputFile);
  app.add_option("--shape", shape, "With --calibration: the GPT's layers,hidden,heads,sequence,vocabulary")
      ->delimiter(',')->expected(5)->check(CLI::PositiveNumber);
  app.add_option("--mlp", mlp, "With --calibration, in place of --shape: chapter 04's MLP, features,hidden,layers "
                 "(data parallel only: --grid N,1,1,1)")
      ->delimiter(',')->expected(3)->check(CLI::PositiveNumber);
  app.add_option("--grid", grid, "With --calibration: DP,TP,PP,CP")->delimiter(',')->expected(4)->check(CLI::PositiveNumber);
  app.add_option("--micro-batch", one.micro_batch, "With --calibration: sequences per micro-batch")
      ->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--zero", one.zero_stage, "With --calibration: ZeRO stage")->check(CLI::Range(0, 3))->capture_default_str();
  app.add_option("--recompute", recompute, "With --calibration: none | selective | full")
      ->check(CLI::IsMember({"none", "selective", "full"}))->capture_default_str();
  app.add_flag("--sequence-parallel", one.sequence_parallel, "With --calibration: sequence parallelism");
  app.add_option("--threads", threads, "With --calibration: a lone rank's threads (mpirun binds a job of one rank to one core)")
      ->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--virtual-stages", one.virtual_stages, "With --calibration: chunks per pipeline rank")
      ->check(CLI::PositiveNumber)->capture_default_str();
  for (const char* flag : {"--shape", "--mlp", "--grid", "--micro-batch", "--zero", "--recompute", "--sequence-parallel",
                           "--threads", "--virtual-stages"})
    cli::refuse_inert(app, flag, [&calibration_path] {
      return calibration_path.empty() ? "describes the one configuration --calibration prices; add --calibration FILE"
                                      : "";
    });
  cli::refuse_inert(app, "--link", [&calibrate, &calibration_path] {
    return calibrate.empty() && calibration_path.empty() ? "is read by --calibrate or --calibration; add one of them" : "";
  });
  return cli::run(app, argc, argv, [&] {
    const DType dtype = precision == "fp32" ? DType::float32 : precision == "fp16" ? DType::float16 : DType::bfloat16;
    if (!calibrate.empty()) {
      if (link_path.empty()) throw UsageError("--calibrate: needs --link, chapter 03's metrics with its alpha-beta fit");
      const Link link = read_link(link_path);
      const Calibration c = measure_this_machine(link);
      try {  // through a temporary made anew and renamed over: never through a link, never half written
        checkpoint::write_file_atomically(calibrate, to_json(c).dump(2) + "\n");
      } catch (const checkpoint::CheckpointError& e) {
        throw UsageError(std::string("--calibrate: ") + e.what());
      }
      const auto line = [](const char* threads, const OpRates& r) {
        std::printf("  %s: linear layers at %.1f GFLOP/s (half of it at %.2g FLOP), a layer's element-wise ops %.1f us + "
                    "%.2f ns a token-channel, attention %.1f us a sequence-head, memory %.1f GB/s\n",
                    threads, r.linear.flops_per_second / 1e9, r.linear.half_rate_flops, r.elementwise_fixed_seconds * 1e6,
                    r.elementwise_seconds_per_element * 1e9, r.attention_seconds_per_head * 1e6, r.bandwidth / 1e9);
      };
      std::printf("This machine, %d cores (forward and backward of each op):\n", c.cores);
      line("one thread", c.one_thread);
      line("every core", c.all_cores);
      std::printf("  an op's fixed cost %.1f us; the link between two ranks alpha %.1f us, %.2f GB/s (chapter 03's fit)\n",
                  c.op_seconds * 1e6, c.link.alpha_seconds * 1e6, c.link.bytes_per_second / 1e9);
      return 0;
    }
    if (!calibration_path.empty()) {
      if (!mlp.empty() && !shape.empty()) throw UsageError("--mlp: prices the MLP in place of --shape's GPT; give one of them");
      if ((shape.size() != 5 && mlp.size() != 3) || grid.size() != 4)
        throw UsageError("--calibration: needs --shape (or --mlp) and --grid");
      Calibration c;
      try {
        c = read_calibration(calibration_path);
      } catch (const std::invalid_argument& e) {
        throw UsageError(std::string("--calibration: ") + e.what());
      }
      if (!link_path.empty()) c.link = read_link(link_path);
      // Ranks on this one machine: their product, in 64 bits, bounded (1024^4 once overflowed to 0 GPUs).
      const long long ranks = 1LL * grid[0] * grid[1] * grid[2] * grid[3];
      if (ranks > kMostRanksHere)
        throw UsageError("--grid: " + std::to_string(grid[0]) + " x " + std::to_string(grid[1]) + " x " +
                         std::to_string(grid[2]) + " x " + std::to_string(grid[3]) + " = " + std::to_string(ranks) +
                         " ranks on this machine; the plan takes at most " + std::to_string(kMostRanksHere));
      one.dp = grid[0], one.tp = grid[1], one.pp = grid[2], one.cp = grid[3];
      if (!mlp.empty()) return price_mlp(app, {mlp[0], mlp[1], mlp[2]}, c, one, global_batch, threads, metrics_path);
      one.recompute = nn::recompute_named(recompute);
      const Workload w{{shape[0], shape[1], shape[2], shape[3], shape[4]}, global_batch, dtype};
      const Cluster cluster = this_machine(c, one.gpus(), threads);
      const Prediction p = predict(w, cluster, one);
      metrics::MetricsWriter metrics(metrics_path);
      if (!p.rejected.empty())  // the model itself, or the grid on it
        throw UsageError((p.rejected.rfind("the heads", 0) == 0 ? "--shape: " : "--grid: ") + p.rejected);
      std::printf("%s on %s: step %.2f ms (compute %.2f, TP %.2f, CP %.2f, PP %.2f, DP %.2f, bubble %.2f, optimizer %.2f); "
                  "memory %.3f MiB (parameters %.3f, gradients %.3f, optimizer %.3f, activations %.3f, buffers %.3f)\n",
                  describe(one).c_str(), cluster.name.c_str(), 1e3 * p.time.total(), 1e3 * p.time.compute,
                  1e3 * p.time.tp, 1e3 * p.time.cp, 1e3 * p.time.pp, 1e3 * p.time.dp, 1e3 * p.time.bubble,
                  1e3 * p.time.optimizer, p.memory.total() / (1 << 20), p.memory.parameters / (1 << 20),
                  p.memory.gradients / (1 << 20), p.memory.optimizer / (1 << 20), p.memory.activations / (1 << 20),
                  p.memory.buffers / (1 << 20));
      metrics.write(to_json(p, 1));
      return 0;
    }
    if (gpus % 8 != 0) throw UsageError("--gpus: " + std::to_string(gpus) + " is not a multiple of 8 (DGX nodes)");
    if (global_batch != static_cast<double>(static_cast<long long>(global_batch)))
      throw UsageError("--global-batch: must be a whole number of sequences");
    metrics::MetricsWriter metrics(metrics_path);
    const Cluster cluster = cluster_named(cluster_name, gpus / 8);
    const Workload w{models.at(model), global_batch, dtype};
    const auto& g = w.shape;
    std::printf("Planner: %s, %lld layers x %lld (%lld heads), sequences of %lld, vocabulary %lld: %.1fB parameters; "
                "global batch %.0f, %s\n",
                model.c_str(), static_cast<long long>(g.layers), static_cast<long long>(g.hidden),
                static_cast<long long>(g.heads), static_cast<long long>(g.sequence),
                static_cast<long long>(g.vocabulary), parameters(g) / 1e9, global_batch, precision.c_str());
    std::printf("Cluster: %s (%d GPUs, %d a node; %.0f TFLOP/s peak, %.1f GiB usable a GPU); simulated: a cost "
                "model, not a run\n",
                cluster.name.c_str(), cluster.gpus(), cluster.gpus_per_node, cluster.device.peak(dtype) / 1e12,
                kUsableMemoryFraction * cluster.device.memory_bytes / kGiB);
    const SearchResult result = search(w, cluster, paper_techniques ? megatron_2021_space() : SearchSpace{});
    std::printf("%ld configurations tried%s: %zu fit\n", result.tried,
                paper_techniques ? " (Megatron-LM 2021's techniques)" : "", result.fitting.size());
    if (!result.fitting.empty()) {
      std::printf("%4s  %-52s %9s %7s %5s %7s | %7s %5s %5s %5s %5s %6s | %6s %s\n", "rank", "configuration",
                  "tokens/s", "TFLOP/s", "MFU", "step s", "compute", "TP", "CP", "PP", "DP", "bubble", "GiB",
                  "(params+grads+optimizer, activations)");
      for (int i = 0; i < top && i < static_cast<int>(result.fitting.size()); ++i) {
        const Prediction& p = result.fitting[static_cast<std::size_t>(i)];
        const auto& t = p.time;
        const double step = t.total();
        const double states = p.memory.parameters + p.memory.gradients + p.memory.optimizer;
        std::printf("%4d  %-52s %9.0f %7.1f %5.2f %7.2f | %6.0f%% %4.0f%% %4.0f%% %4.0f%% %4.0f%% %5.0f%% | %6.1f (%.1f, %.1f)\n",
                    i + 1, describe(p.config).c_str(), p.tokens_per_second, p.tflops_per_gpu, p.mfu, step,
                    100 * t.compute / step, 100 * t.tp / step, 100 * t.cp / step, 100 * t.pp / step, 100 * t.dp / step,
                    100 * t.bubble / step, p.memory.total() / kGiB, states / kGiB, p.memory.activations / kGiB);
        metrics.write(to_json(p, i + 1));
      }
    }
    std::printf("Rejected:\n");
    for (const auto& [kind, group] : result.rejected) {
      std::printf("  %6ld %s, e.g. %s: %s\n", group.count, kind.c_str(), describe(group.example.config).c_str(),
                  group.example.rejected.c_str());
      metrics.write({{"event", "plan_rejected"}, {"reason", kind}, {"count", group.count},
                     {"example", describe(group.example.config)}, {"detail", group.example.rejected}});
    }
    if (published) print_published(metrics);
    return 0;
  });
}
