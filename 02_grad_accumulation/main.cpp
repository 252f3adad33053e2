// Chapter 02: gradient accumulation. k micro-batches of b samples, each loss scaled by its share of
// the batch (1/k when all are full), give the same update as one batch of k*b samples with a mean
// loss, while holding only one micro-batch of activations at a time. The program trains both ways
// from the same start and reports peak activation memory for each; it checks, step by step from the
// same weights, that the accumulated gradient equals the big batch's within its float32 bound, and
// compares the final weights with the big batch's own rounding noise.
#include <algorithm>
#include <cmath>
#include <functional>

#include <CLI/CLI.hpp>

#include "common/checkpoint/parameters.h"  // --save: the final parameters as safetensors
#include "common/cli/cli.h"                 // common flags, validators, exit codes
#include "common/cli/limits.h"              // refuse what cannot fit in memory
#include "common/cli/model_options.h"       // the MLP's sizes, as every chapter names them
#include "common/cli/session.h"             // device and metrics, set up once
#include "common/core/exercise.h"           // exercise::not_done: the participant's copy stops at an unwritten one
#include "common/core/log.h"                // log(): what rank 0 prints
#include "common/core/memory.h"             // peak activation bytes from the device counters
#include "common/data/house_prices.h"       // the wide house-price data and batching
#include "common/metrics/metrics.h"         // JSON-lines metrics
#include "common/nn/layers.h"               // make_mlp
#include "common/ops/ops.h"                 // mse_loss, scale
#include "common/optim/optimizer.h"         // optim::SGD
#include "common/verify/compare.h"          // max_abs_diff, the noise floor
#include "common/verify/lockstep.h"         // the step-by-step check against the exact sum of the parts
#include "common/verify/step_check.h"       // behind the course's one check interface

using namespace course;

namespace {

struct Options {
  cli::CommonOptions common;
  std::int64_t micro_batch = 16;
  int accum = 4;
  int epochs = 3;
  cli::MlpOptions mlp;  // --samples 1000, --features 16, --hidden 128, --layers 2
  float lr = 0.01f;
  std::string save;
};

struct RunResult {
  std::vector<float> weights;  // every parameter, flattened in registration order
  float final_loss = 0.0f;
  std::int64_t peak_activation_bytes = 0;
  int optimizer_steps = 0;
  std::shared_ptr<nn::Module> model;
  verify::LockstepSummary check;  // the lock-step check's verdict (none for an unchecked run)
};

// The check a run is given for its model: the lock-step check (below the fence), or none.
using MakeCheck = std::function<std::unique_ptr<verify::StepCheck>(const nn::Module& model)>;

std::shared_ptr<nn::Sequential> make_model(const Options& o, const data::Dataset& dataset, Device device) {
  return nn::make_mlp(dataset.features, o.mlp.hidden, o.mlp.layers, 1, nn::Activation::relu, device, o.common.seed);
}

// One micro-batch's loss, weighted by its share of the global batch, forward and backward. Backward adds
// into .grad (+=), so the micro-batches' gradients accumulate. Returns the weighted loss.
float micro_batch_step(nn::Module& model, const data::Dataset& dataset, const std::vector<std::int64_t>& micro,
                       float weight, Device device) {
  data::Batch batch = data::make_batch(dataset, micro, device);
  Tensor loss = scale(mse_loss(model(batch.x), batch.y), weight);
  loss.backward();
  return loss.item();
}

// EXERCISE 02.1: one optimizer step's gradient over micro-batches.
// Cut `global` into micro-batches of at most `micro_batch` samples (data::split_batches: the last may be
// shorter), run micro_batch_step on each with the weight that makes the gradients it adds into .grad sum
// to the gradient of the global batch's mean loss, and return the weighted losses' sum (that mean).
// Hint: a micro-batch's mean counts for its share of the global batch, not for 1/k. Graded by ex02.1.
float accumulate_gradients(nn::Module& model, const data::Dataset& dataset, const std::vector<std::int64_t>& global,
                           std::int64_t micro_batch, Device device) {
  // BEGIN EXERCISE 02.1
  const auto global_size = static_cast<float>(global.size());
  float total = 0;
  for (auto& micro : data::split_batches(global, micro_batch)) {
    // Mean over the micro-batch, weighted by its share of the global batch: the sum of these
    // is the mean over the global batch. For k full micro-batches the weight is exactly 1/k.
    total += micro_batch_step(model, dataset, micro, static_cast<float>(micro.size()) / global_size, device);
  }
  return total;
  // END EXERCISE 02.1
}

// One run. With accum = 1 and micro_batch = k*b it is the big-batch reference; `reversed` sums each
// batch in reverse sample order, for the noise floor.
RunResult run(const Options& o, const data::Dataset& dataset, Device device, std::int64_t micro_batch, int accum,
              const MakeCheck& make_check, bool reversed = false) {
  auto model = make_model(o, dataset, device);
  optim::SGD sgd(model->parameters(), o.lr);
  auto check = make_check(*model);  // --verify's lock-step check, or none: below the fence
  reset_peak_memory(device);
  RunResult result;
  std::int64_t step = 0;
  for (int epoch = 1; epoch <= o.epochs; ++epoch) {
    auto order = data::shuffled_indices(dataset.size, o.common.seed, static_cast<std::uint64_t>(epoch));
    for (auto& global : data::split_batches(order, micro_batch * accum)) {  // the last one may be partial
      if (reversed) std::reverse(global.begin(), global.end());
      check->begin_step(step);
      const float loss = accumulate_gradients(*model, dataset, global, micro_batch, device);
      check->check_gradient(step, loss);
      sgd.step();       // one update for the k micro-batches
      sgd.zero_grad();  // and only now the gradients are cleared
      check->check_update(step++, 0.0);
    }
  }
  result.optimizer_steps = static_cast<int>(step);
  result.peak_activation_bytes = memory_stats(device).peak_of(MemoryCategory::activations);
  result.weights = model->parameters_to_host();
  result.model = model;
  data::Batch all = data::make_batch(dataset, data::shuffled_indices(dataset.size, 0, 0), device);
  result.final_loss = mse_loss((*model)(all.x), all.y).item();
  result.check = check->finish();
  return result;
}

// ---------------------------------------------------------------------------------------------------
// Below: the check that accumulation is the big batch (in lock-step, and as a drift figure), and the
// report. The lesson is above: accumulate_gradients and the run that steps once per k micro-batches.

// From the same weights at every step, the accumulated gradient against the exact sum of its parts, and
// the update against SGD's from it (verify/lockstep.h), behind the course's one check interface
// (verify/step_check.h). The check draws each step's global batch itself, from the seed and the epochs,
// so a run that trains on the wrong samples fails it too.
class AccumulationCheck final : public verify::StepCheck {
 public:
  AccumulationCheck(const Options& o, const data::Dataset& dataset, Device device, const nn::Module& model)
      : o_(o), dataset_(dataset), device_(device), model_(model) {
    for (int epoch = 1; epoch <= o.epochs; ++epoch)
      for (auto& global : data::split_batches(
               data::shuffled_indices(dataset.size, o.common.seed, static_cast<std::uint64_t>(epoch)), o.micro_batch * o.accum))
        batches_.push_back(std::move(global));
    auto reference = verify::make_reference([&] { return make_model(o, dataset, device); });
    reference_sgd_ = std::make_unique<optim::SGD>(reference->parameters(), o.lr);
    lockstep_ = std::make_unique<verify::Lockstep>(reference, [this](std::int64_t) {
      reference_sgd_->step();
      reference_sgd_->zero_grad();
    }, nullptr);
    lockstep_->set_optimizer(*reference_sgd_);  // and SGD's formula itself (verify/reference_optimizer.h)
  }

 protected:
  void on_begin_step(std::int64_t step) override { lockstep_->begin_step(step, model_); }
  // The reference computes each weighted micro-batch gradient on its own and adds them exactly: the
  // accumulated .grad must be their sum, up to the rounding of the += additions.
  void on_check_gradient(std::int64_t step, float loss) override {
    const auto& global = batches_.at(static_cast<std::size_t>(step));
    auto micro = data::split_batches(global, o_.micro_batch);
    lockstep_->check_parts(step, model_, loss, micro.size(), 1.0, [&](nn::Module& reference, std::size_t m) {
      return micro_batch_step(reference, dataset_, micro[m],
                              static_cast<float>(micro[m].size()) / static_cast<float>(global.size()), device_);
    });
  }
  void on_check_update(std::int64_t step, double) override { lockstep_->check_update(step); }
  verify::LockstepSummary on_finish() override { return lockstep_->finish(model_); }

 private:
  const Options& o_;
  const data::Dataset& dataset_;
  Device device_;
  const nn::Module& model_;
  std::vector<std::vector<std::int64_t>> batches_;  // each step's global batch, in order
  std::unique_ptr<optim::SGD> reference_sgd_;
  std::unique_ptr<verify::Lockstep> lockstep_;
};

int compare(const Options& o, Device device, metrics::MetricsWriter& out) {
  data::Dataset dataset = data::make_house_prices_wide(o.mlp.samples, o.mlp.features, o.common.seed);
  const std::int64_t global_batch = o.micro_batch * o.accum;
  log("Gradient accumulation: %d micro-batches of %lld versus one batch of %lld, %lld samples, %d epochs, on %s\n",
      o.accum, static_cast<long long>(o.micro_batch), static_cast<long long>(global_batch),
      static_cast<long long>(o.mlp.samples), o.epochs, device_name(device));
  const MakeCheck none = [](const nn::Module&) { return verify::unchecked(); };
  RunResult accumulated = run(o, dataset, device, o.micro_batch, o.accum, [&](const nn::Module& model) {
    return std::make_unique<AccumulationCheck>(o, dataset, device, model);
  });
  RunResult big = run(o, dataset, device, global_batch, 1, none);
  RunResult reordered = run(o, dataset, device, global_batch, 1, none, true);
  const verify::LockstepSummary& check = accumulated.check;
  const verify::Drift drift{verify::max_abs_diff(accumulated.weights, big.weights),
                            verify::max_abs_diff(big.weights, reordered.weights)};
  const bool passed = check.passed && accumulated.optimizer_steps == big.optimizer_steps;

  auto show = [](const char* name, const RunResult& r) {
    log("  %-22s steps %4d  loss %.6f  first weights:", name, r.optimizer_steps, r.final_loss);
    for (std::size_t i = 0; i < std::min<std::size_t>(4, r.weights.size()); ++i) log(" %+.6f", r.weights[i]);
    log("\n");
  };
  show("accumulated (k x b):", accumulated);
  show("one big batch (k*b):", big);
  if (check.passed)
    log("  lock-step check, %lld steps: every accumulated gradient within its float32 bound of the exact sum of "
        "its micro-batches' (largest difference %.3g, %.3g of its bound)\n",
        static_cast<long long>(check.steps), check.worst_gradient_diff, check.worst_gradient_ratio);
  else
    log("  lock-step check FAILED at step %lld: %s\n", static_cast<long long>(check.first_failed_step),
        check.first_failure.c_str());
  log("  largest weight difference: %.3g; noise floor (the big batch summed in reverse order) %.3g; ratio %.3g\n",
      drift.difference, drift.noise_floor, drift.ratio());
  log("  peak activation memory: accumulated %s, big batch %s (%.2fx less)\n",
      format_bytes(accumulated.peak_activation_bytes).c_str(), format_bytes(big.peak_activation_bytes).c_str(),
      static_cast<double>(big.peak_activation_bytes) / std::max<double>(1.0, static_cast<double>(accumulated.peak_activation_bytes)));
  if (!o.save.empty()) {
    checkpoint::save_parameters(o.save, *accumulated.model, {{"chapter", "02_grad_accumulation"}});
    log("parameters of the accumulated run saved to %s\n", o.save.c_str());
  }
  log("%s\n", passed ? "PASSED" : "FAILED");

  out.write({{"event", "accumulation"}, {"micro_batch", o.micro_batch}, {"accum", o.accum},
             {"global_batch", global_batch}, {"samples", o.mlp.samples}, {"device", device_name(device)},
             {"max_weight_diff", drift.difference}, {"noise_floor", drift.noise_floor}, {"drift_ratio", drift.ratio()},
             {"lockstep_passed", check.passed}, {"first_failed_step", check.first_failed_step},
             {"gradient_bound_ratio", check.worst_gradient_ratio},
             {"optimizer_steps", accumulated.optimizer_steps}, {"loss_accumulated", accumulated.final_loss},
             {"loss_big_batch", big.final_loss}, {"peak_activation_bytes_accumulated", accumulated.peak_activation_bytes},
             {"peak_activation_bytes_big_batch", big.peak_activation_bytes}, {"passed", passed}});
  return passed ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  cli::Program program{"Chapter 02: gradient accumulation, checked against one big batch"};
  CLI::App& app = program.app();
  Options o;
  cli::add_common_options(app, o.common);
  cli::add_save_option(app, o.save);
  o.mlp.samples = 1000;
  o.mlp.hidden = 128;
  cli::add_mlp_options(app, o.mlp);  // --samples, --features, --hidden, --layers: shared names and bounds
  app.add_option("--lr", o.lr, "SGD learning rate")->check(cli::PositiveFinite)->capture_default_str();
  app.add_option("--micro-batch", o.micro_batch, "Samples per micro-batch (b)")
      ->check(cli::PositiveInteger)->capture_default_str();
  app.add_option("--accum", o.accum, "Micro-batches per optimizer step (k)")
      ->check(cli::PositiveInteger)->capture_default_str();
  app.add_option("--epochs", o.epochs, "Passes over the dataset")->check(cli::PositiveInteger)->capture_default_str();
  return program.run(argc, argv, [&] {
    if (o.micro_batch > o.mlp.samples / o.accum)
      throw UsageError("--micro-batch: " + std::to_string(o.micro_batch) + " x --accum " + std::to_string(o.accum) +
                       " is more than the " + std::to_string(o.mlp.samples) + " samples (--samples)");
    cli::check_memory(cli::mlp_training_bytes(o.mlp.samples, o.mlp.features, o.mlp.hidden, o.mlp.layers, o.micro_batch * o.accum),
                      "--samples " + std::to_string(o.mlp.samples) + ", --hidden " + std::to_string(o.mlp.hidden) +
                          ", --layers and --micro-batch x --accum");
    cli::Session session = cli::start_session(o.common);
    return compare(o, session.device, session.metrics);
  });
}
