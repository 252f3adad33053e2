// Chapter 02: gradient accumulation. k micro-batches of b samples, each loss scaled by its share of
// the batch (1/k when all are full), give the same update as one batch of k*b samples with a mean
// loss, while holding only one micro-batch of activations at a time. The program trains both ways
// from the same start, compares the weights, and reports peak activation memory for each.
#include <algorithm>
#include <cmath>

#include "common/cli/cli.h"             // common flags, validators, exit codes
#include "common/cli/log.h"             // log(): what rank 0 prints
#include "common/core/memory.h"         // peak activation bytes from the device counters
#include "common/data/house_prices.h"   // the wide house-price data and batching
#include "common/metrics/metrics.h"     // JSON-lines metrics
#include "common/nn/layers.h"           // make_mlp
#include "common/ops/ops.h"             // mse_loss, scale
#include "common/optim/optimizer.h"     // SGD

using namespace course;

namespace {

// The two runs sum the same per-sample gradients in a different order (k partial sums added
// together versus one GEMM over the whole batch); float32 rounding differs by ~1e-7 relative per
// step, and SGD carries it forward. 1e-5 bounds that drift for this chapter's default run.
constexpr float kEquivalenceTolerance = 1e-5f;

struct Options {
  cli::CommonOptions common;
  std::int64_t micro_batch = 16;
  int accum = 4;
  std::int64_t samples = 1000;
  int epochs = 3;
  float lr = 0.01f;
  std::int64_t features = 16;
  std::int64_t hidden = 128;
  int layers = 2;
};

struct RunResult {
  std::vector<float> weights;  // every parameter, flattened in registration order
  float final_loss = 0.0f;
  std::int64_t peak_activation_bytes = 0;
  int optimizer_steps = 0;
};

// One run. With accum = 1 and micro_batch = k*b it is the big-batch reference.
RunResult run(const Options& o, const data::Dataset& dataset, Device device, std::int64_t micro_batch, int accum) {
  auto model = nn::make_mlp(dataset.features, o.hidden, o.layers, 1, nn::Activation::relu, device, o.common.seed);
  optim::SGD sgd(model->parameters(), o.lr);
  reset_peak_memory(device);
  RunResult result;
  const std::int64_t global_batch = micro_batch * accum;
  for (int epoch = 1; epoch <= o.epochs; ++epoch) {
    auto order = data::shuffled_indices(dataset.size, o.common.seed, static_cast<std::uint64_t>(epoch));
    for (auto& global : data::split_batches(order, global_batch)) {  // the last one may be partial
      const auto global_size = static_cast<float>(global.size());
      for (auto& micro : data::split_batches(global, micro_batch)) {
        data::Batch batch = data::make_batch(dataset, micro, device);
        // Mean over the micro-batch, weighted by its share of the global batch: the sum of these
        // is the mean over the global batch. For k full micro-batches the weight is exactly 1/k.
        Tensor loss = scale(mse_loss((*model)(batch.x), batch.y), static_cast<float>(micro.size()) / global_size);
        loss.backward();  // gradients accumulate (+=) across micro-batches
      }
      sgd.step();
      sgd.zero_grad();
      ++result.optimizer_steps;
    }
  }
  result.peak_activation_bytes = memory_stats(device).peak_of(MemoryCategory::activations);
  result.weights = model->parameters_to_host();
  data::Batch all = data::make_batch(dataset, data::shuffled_indices(dataset.size, 0, 0), device);
  result.final_loss = mse_loss((*model)(all.x), all.y).item();
  return result;
}

int compare(const Options& o, Device device, metrics::MetricsWriter& out) {
  data::Dataset dataset = data::make_house_prices_wide(o.samples, o.features, o.common.seed);
  const std::int64_t global_batch = o.micro_batch * o.accum;
  log("Gradient accumulation: %d micro-batches of %lld versus one batch of %lld, %lld samples, %d epochs, on %s\n",
      o.accum, static_cast<long long>(o.micro_batch), static_cast<long long>(global_batch),
      static_cast<long long>(o.samples), o.epochs, device_name(device));
  RunResult accumulated = run(o, dataset, device, o.micro_batch, o.accum);
  RunResult big = run(o, dataset, device, global_batch, 1);

  float max_diff = 0.0f;
  for (std::size_t i = 0; i < big.weights.size(); ++i)
    max_diff = std::max(max_diff, std::fabs(accumulated.weights[i] - big.weights[i]));
  const bool passed = max_diff <= kEquivalenceTolerance && accumulated.optimizer_steps == big.optimizer_steps;

  auto show = [](const char* name, const RunResult& r) {
    log("  %-22s steps %4d  loss %.6f  first weights:", name, r.optimizer_steps, r.final_loss);
    for (std::size_t i = 0; i < std::min<std::size_t>(4, r.weights.size()); ++i) log(" %+.6f", r.weights[i]);
    log("\n");
  };
  show("accumulated (k x b):", accumulated);
  show("one big batch (k*b):", big);
  log("  largest weight difference: %.3g (tolerance %.0e)\n", max_diff, kEquivalenceTolerance);
  log("  peak activation memory: accumulated %s, big batch %s (%.2fx less)\n",
      format_bytes(accumulated.peak_activation_bytes).c_str(), format_bytes(big.peak_activation_bytes).c_str(),
      static_cast<double>(big.peak_activation_bytes) / std::max<double>(1.0, static_cast<double>(accumulated.peak_activation_bytes)));
  log("%s\n", passed ? "PASSED" : "FAILED");

  out.write({{"event", "accumulation"}, {"micro_batch", o.micro_batch}, {"accum", o.accum},
             {"global_batch", global_batch}, {"samples", o.samples}, {"device", device_name(device)},
             {"max_weight_diff", max_diff}, {"tolerance", kEquivalenceTolerance},
             {"optimizer_steps", accumulated.optimizer_steps}, {"loss_accumulated", accumulated.final_loss},
             {"loss_big_batch", big.final_loss}, {"peak_activation_bytes_accumulated", accumulated.peak_activation_bytes},
             {"peak_activation_bytes_big_batch", big.peak_activation_bytes}, {"passed", passed}});
  return passed ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Chapter 02: gradient accumulation, checked against one big batch"};
  Options o;
  cli::add_common_options(app, o.common);
  app.add_option("--micro-batch", o.micro_batch, "Samples per micro-batch (b)")
      ->check(cli::PositiveInteger)->capture_default_str();
  app.add_option("--accum", o.accum, "Micro-batches per optimizer step (k)")
      ->check(cli::PositiveInteger)->capture_default_str();
  app.add_option("--samples", o.samples, "Dataset size (need not divide by k*b)")
      ->check(cli::PositiveInteger)->capture_default_str();
  app.add_option("--epochs", o.epochs, "Passes over the dataset")->check(cli::PositiveInteger)->capture_default_str();
  app.add_option("--lr", o.lr, "SGD learning rate")->check(cli::PositiveFinite)->capture_default_str();
  app.add_option("--features", o.features, "Input features")->check(CLI::Range(2, 1 << 16))->capture_default_str();
  app.add_option("--hidden", o.hidden, "Hidden width")->check(cli::PositiveInteger)->capture_default_str();
  app.add_option("--layers", o.layers, "Hidden layers")->check(cli::PositiveInteger)->capture_default_str();
  return cli::run(app, argc, argv, [&] {
    Device device = select_device(o.common.device);
    metrics::MetricsWriter out(o.common.metrics);
    return compare(o, device, out);
  });
}
