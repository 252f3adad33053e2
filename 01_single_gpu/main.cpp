// Chapter 01: training on one device. The house-price model y = x1*w1 + x2*w2 + b, learned by
// plain SGD one sample at a time: forward, backward, update, zero_grad. With --model mlp, a wider
// model on a wider dataset, timed in samples/s to show where a GPU pays off.
#include <algorithm>
#include <array>
#include <cmath>
#include <vector>

#include <CLI/CLI.hpp>

#include "common/autograd/autograd.h"   // NoGradGuard: evaluation without recording a graph
#include "common/checkpoint/parameters.h"  // --save: the final parameters as safetensors
#include "common/cli/cli.h"
#include "common/cli/model_options.h"  // the MLP's sizes, as every chapter names them
#include "common/cli/limits.h"          // refuse what cannot fit in memory
#include "common/cli/session.h"         // device and metrics, set up once
#include "common/core/exercise.h"       // exercise::not_done: the participant's copy stops at an unwritten one
#include "common/core/log.h"            // log(): what rank 0 prints
#include "common/data/house_prices.h"   // the synthetic data with known true weights
#include "common/metrics/metrics.h"     // JSON-lines metrics
#include "common/metrics/timer.h"       // step timing
#include "common/nn/layers.h"           // Linear, make_mlp
#include "common/ops/ops.h"             // mse_loss
#include "common/optim/optimizer.h"     // optim::SGD

using namespace course;

namespace {

// With noise 0.1 on 1000 samples and per-sample SGD at lr 0.01, the weights jitter around the
// least-squares fit by about a hundredth; 0.05 accepts that and rejects a model that did not learn.
constexpr float kWeightTolerance = 0.05f;
// The gradient by hand against autograd's: both take 2 (y_pred - y) times an input, a few float32
// roundings that autograd's GEMM may fuse; 1e-5 relative (about 80 ulps) holds those and no real slip.
constexpr float kHandGradientTolerance = 1e-5f;
bool close_to(float hand, float autograd) {
  return std::fabs(hand - autograd) <= kHandGradientTolerance * std::max(1.0f, std::fabs(autograd));
}

struct Options {
  cli::CommonOptions common;
  std::string model = "linear";
  int epochs = 10;
  std::int64_t batch_size = 1;
  cli::MlpOptions mlp;  // --samples 1000 (both models), --features 16, --hidden 256, --layers 3 (mlp)
  std::string activation = "relu";
  float lr = 0.01f;
  std::string save;
};

// EXERCISE 01.1: the gradient of one sample's squared error, by hand.
// The model predicts y_pred = w1 x1 + w2 x2 + b and the loss is L = (y_pred - y)^2. Return
// {dL/dw1, dL/dw2, dL/db} at this sample, from the chain rule alone (no autograd): the worked example
// below prints yours beside autograd's and fails when they differ. Hint: dL/dy_pred first.
std::array<float, 3> gradient_by_hand(float x1, float x2, float y, float y_pred) {
  // BEGIN EXERCISE 01.1
  const float d_prediction = 2.0f * (y_pred - y);  // dL/dy_pred
  return {d_prediction * x1, d_prediction * x2, d_prediction};  // times dy_pred/dw1, dy_pred/dw2, dy_pred/db
  // END EXERCISE 01.1
}

// The worked example: start from w = (1, 1), b = 0 and take two SGD steps at lr = 1e-3 on
// (6, 2) -> 15 and (5, 2) -> 12, printing every quantity the hand derivation uses, and the gradient by
// hand (gradient_by_hand) beside autograd's. Returns whether the two agree.
bool worked_example(Device device, metrics::MetricsWriter& out) {
  constexpr float kLr = 1e-3f;
  nn::Linear model(2, 1, device, 0);
  model.weight.copy_from(Tensor::from_host({1.0f, 1.0f}, {1, 2}));
  model.bias.copy_from(Tensor::from_host({0.0f}, {1}));
  optim::SGD sgd(model.parameters(), kLr);
  const float xs[2][2] = {{6, 2}, {5, 2}};
  const float ys[2] = {15, 12};
  log("Worked example (lr = %g), starting from w1 = 1, w2 = 1, b = 0:\n", kLr);
  bool agree = true;
  for (int step = 0; step < 2; ++step) {
    Tensor x = Tensor::from_host({xs[step][0], xs[step][1]}, {1, 2}, device);
    Tensor y = Tensor::from_host({ys[step]}, {1, 1}, device);
    Tensor prediction = model(x);                 // forward: builds the graph
    Tensor loss = mse_loss(prediction, y);        // L = (y_pred - y)^2
    loss.backward();                              // dL/dw1 = 2 (y_pred - y) x1, dL/dw2 = ..., dL/db = 2 (y_pred - y)
    auto gw = model.weight.grad().to_host();
    float gb = model.bias.grad().item();
    const std::array<float, 3> hand = gradient_by_hand(xs[step][0], xs[step][1], ys[step], prediction.item());
    agree = agree && close_to(hand[0], gw[0]) && close_to(hand[1], gw[1]) && close_to(hand[2], gb);
    sgd.step();                                   // w <- w - lr * dL/dw
    sgd.zero_grad();                              // gradients accumulate until cleared
    auto w = model.weight.to_host();
    float b = model.bias.item();
    log("  step %d: x = (%g, %g), y = %g, y_pred = %g, loss = %g\n", step + 1, xs[step][0], xs[step][1], ys[step],
        prediction.item(), loss.item());
    log("          dL/dw1 = %g, dL/dw2 = %g, dL/db = %g -> w1 = %.6f, w2 = %.6f, b = %.6f\n", gw[0], gw[1], gb, w[0],
        w[1], b);
    log("          by hand: dL/dw1 = %g, dL/dw2 = %g, dL/db = %g\n", hand[0], hand[1], hand[2]);
    out.write({{"event", "worked_step"}, {"step", step + 1}, {"x", {xs[step][0], xs[step][1]}}, {"y", ys[step]},
               {"prediction", prediction.item()}, {"loss", loss.item()}, {"grad_w", gw}, {"grad_b", gb},
               {"w", w}, {"b", b}, {"lr", kLr}, {"grad_by_hand", hand}});
  }
  if (!agree) log("the gradient by hand (gradient_by_hand) differs from autograd's\n");
  return agree;
}

std::shared_ptr<nn::Module> build_model(const Options& o, Device device, std::int64_t features) {
  if (o.model == "mlp")
    return nn::make_mlp(features, o.mlp.hidden, o.mlp.layers, 1, nn::parse_activation(o.activation), device, o.common.seed);
  return std::make_shared<nn::Linear>(features, 1, device, o.common.seed);
}

// Mean squared error over the whole dataset, without recording a graph.
float evaluate(nn::Module& model, const data::Dataset& dataset, Device device) {
  autograd::NoGradGuard no_grad;
  double total = 0.0;
  auto order = data::shuffled_indices(dataset.size, 0, 0);
  for (auto& indices : data::split_batches(order, 4096)) {
    data::Batch batch = data::make_batch(dataset, indices, device);
    total += static_cast<double>(mse_loss(model(batch.x), batch.y).item()) * static_cast<double>(indices.size());
  }
  return static_cast<float>(total / static_cast<double>(dataset.size));
}

int train(const Options& o, Device device, metrics::MetricsWriter& out) {
  const bool mlp = o.model == "mlp";
  data::Dataset dataset = mlp ? data::make_house_prices_wide(o.mlp.samples, o.mlp.features, o.common.seed)
                              : data::make_house_prices(o.mlp.samples, o.common.seed);
  auto model = build_model(o, device, dataset.features);
  optim::SGD sgd(model->parameters(), o.lr);
  log("Training %s (%lld parameters) on %lld samples, batch %lld, %d epochs on %s, SGD at lr %g\n", o.model.c_str(),
      static_cast<long long>(model->parameter_count()), static_cast<long long>(dataset.size),
      static_cast<long long>(o.batch_size), o.epochs, device_name(device), o.lr);
  float initial = evaluate(*model, dataset, device);
  log("epoch %3d  loss %.6f\n", 0, initial);
  out.write({{"event", "epoch"}, {"epoch", 0}, {"loss", initial}});

  metrics::Timer timer(device);
  double train_ms = 0.0;
  std::int64_t timed_samples = 0;
  for (int epoch = 1; epoch <= o.epochs; ++epoch) {
    auto batches = data::split_batches(data::shuffled_indices(dataset.size, o.common.seed, epoch), o.batch_size);
    for (auto& indices : batches) {
      data::Batch batch = data::make_batch(dataset, indices, device);
      timer.start();
      Tensor loss = mse_loss((*model)(batch.x), batch.y);  // forward: builds the graph
      loss.backward();                                    // fills every weight's .grad
      sgd.step();                                         // w <- w - lr * .grad
      sgd.zero_grad();                                    // .grad accumulates until cleared
      double ms = timer.stop_ms();
      if (epoch > 1 || &indices != &batches.front()) {      // the first step warms caches up
        train_ms += ms;
        timed_samples += static_cast<std::int64_t>(indices.size());
      }
    }
    float loss = evaluate(*model, dataset, device);
    log("epoch %3d  loss %.6f\n", epoch, loss);
    out.write({{"event", "epoch"}, {"epoch", epoch}, {"loss", loss}});
  }

  // ------------------------------------------------------------------------------------------------
  // Below: what the run reports, and its check (the linear model finds the true weights; the MLP learns).
  double samples_per_s = train_ms > 0 ? static_cast<double>(timed_samples) / (train_ms / 1000.0) : 0.0;
  log("throughput: %.0f samples/s (%.3f ms per step of %lld samples)\n", samples_per_s,
      train_ms / std::max<double>(1.0, static_cast<double>(timed_samples) / static_cast<double>(o.batch_size)),
      static_cast<long long>(o.batch_size));

  const float final_loss = evaluate(*model, dataset, device);
  bool passed = final_loss < initial;  // the MLP's check: it learned something
  nlohmann::json final_record = {{"event", "final"}, {"model", o.model}, {"device", device_name(device)},
                                 {"samples_per_s", samples_per_s}, {"batch_size", o.batch_size},
                                 {"loss", final_loss}};
  if (!mlp) {
    auto& linear = static_cast<nn::Linear&>(*model);
    auto w = linear.weight.to_host();
    float b = linear.bias.item();
    log("learned: w1 = %.4f  w2 = %.4f  b = %.4f\n", w[0], w[1], b);
    log("true:    w1 = %.4f  w2 = %.4f  b = %.4f\n", dataset.true_weights[0], dataset.true_weights[1],
        dataset.true_bias);
    final_record["weights"] = w;
    final_record["bias"] = b;
    final_record["true_weights"] = dataset.true_weights;
    final_record["true_bias"] = dataset.true_bias;
    passed = std::fabs(w[0] - dataset.true_weights[0]) <= kWeightTolerance &&
             std::fabs(w[1] - dataset.true_weights[1]) <= kWeightTolerance &&
             std::fabs(b - dataset.true_bias) <= kWeightTolerance;
  }
  final_record["passed"] = passed;
  out.write(final_record);
  if (!o.save.empty()) {
    checkpoint::save_parameters(o.save, *model, {{"chapter", "01_single_gpu"}, {"model", o.model}});
    log("parameters saved to %s\n", o.save.c_str());
  }
  log("%s\n", passed ? "PASSED" : "FAILED");
  return passed ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  cli::Program program{"Chapter 01: train the house-price model on one device (forward, backward, step, zero_grad)"};
  CLI::App& app = program.app();
  Options o;
  cli::add_common_options(app, o.common);
  cli::add_save_option(app, o.save);
  o.mlp.samples = 1000;
  o.mlp.layers = 3;
  cli::add_mlp_options(app, o.mlp);  // --samples, --features, --hidden, --layers: shared names and bounds
  app.add_option("--model", o.model, "linear (the house-price model) or mlp (wider data, timed)")
      ->check(CLI::IsMember({"linear", "mlp"}))->capture_default_str();
  app.add_option("--epochs", o.epochs, "Passes over the dataset")->check(cli::PositiveInteger)->capture_default_str();
  app.add_option("--lr", o.lr, "SGD learning rate")->check(cli::PositiveFinite)->capture_default_str();
  app.add_option("--batch-size", o.batch_size, "Samples per step (1 = one sample per step, as in the lesson)")
      ->check(cli::PositiveInteger)->capture_default_str();
  app.add_option("--activation", o.activation, "relu or gelu (mlp)")
      ->check(CLI::IsMember({"relu", "gelu"}))->capture_default_str();
  return program.run(argc, argv, [&] {
    const bool mlp = o.model == "mlp";
    cli::check_memory(cli::mlp_training_bytes(o.mlp.samples, mlp ? o.mlp.features : 2, mlp ? o.mlp.hidden : 0, mlp ? o.mlp.layers : 0,
                                              o.batch_size),
                      "--samples " + std::to_string(o.mlp.samples) + ", --batch-size " + std::to_string(o.batch_size) +
                          (mlp ? ", --features, --hidden and --layers" : ""));
    cli::Session session = cli::start_session(o.common);
    if (o.model == "linear" && !worked_example(session.device, session.metrics)) {
      log("FAILED\n");
      return 1;
    }
    return train(o, session.device, session.metrics);
  });
}
