// One training step (forward, backward, optimizer step, zero_grad) of the course's MLP or GPT, timed;
// for the MLP also the step's GEMMs alone, called straight on OpenBLAS in the same run, so the ratio
// step / GEMMs says how much the library adds on top of the arithmetic it cannot avoid.
//   bench_step --model mlp --width 1024 --threads 2
//   bench_step --model gpt --threads 1 --json
// --save-init FILE writes the initial weights and the batch (safetensors, with the run's settings in its
// metadata): benchmarks/peer/peer_step.py loads them into PyTorch, runs the same step, and compares
// both the time and the first losses.
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "common/checkpoint/parameters.h"
#include "common/cli/cli.h"
#include "common/cli/model_options.h"
#include "common/core/cuda_runtime.h"
#include "common/kernels/kernels.h"
#include "common/nn/tasks.h"
#include "common/optim/optimizer.h"

using namespace course;

namespace {

struct Options {
  std::string model = "mlp";
  std::int64_t width = 256;  // the MLP's hidden width, and its batch
  std::int64_t batch = 240;  // the GPT's batch (chapter 04's global batch)
  int threads = 1;
  int steps = 30, warmup = 3, check_steps = 3;
  std::string save_init;
  bool json = false;
  cli::CommonOptions common;
};

constexpr std::int64_t kMlpFeatures = 16;  // chapter 01's wide house-price model: 16 features, 3 hidden layers
constexpr int kMlpHiddenLayers = 3;
constexpr float kMlpLr = 1e-3f;
constexpr float kGptLr = 1e-3f, kGptWeightDecay = 0.1f;  // chapter 04's AdamW settings

double ms_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

void sync(Device device) {
#if COURSE_HAVE_CUDA
  if (device == Device::cuda) cuda::synchronize();
#else
  (void)device;
#endif
}

// The GEMMs one MLP step must do, layer by layer: y = x W^T forward; dW = dy^T x and dx = dy W backward
// (no dx for the first layer: the data needs no gradient).
struct Gemm {
  bool ta, tb;
  std::int64_t m, n, k;
};
std::vector<Gemm> mlp_gemms(std::int64_t batch, const std::vector<std::int64_t>& sizes) {
  std::vector<Gemm> gemms;
  for (std::size_t l = 0; l + 1 < sizes.size(); ++l) {
    const std::int64_t in = sizes[l], out = sizes[l + 1];
    gemms.push_back({false, true, batch, out, in});
    gemms.push_back({true, false, out, in, batch});
    if (l > 0) gemms.push_back({false, false, batch, in, out});
  }
  return gemms;
}

// Each GEMM on operands of its own, as in the step (one buffer reused by all of them would stay in cache
// and flatter the GEMMs).
double time_gemms(const std::vector<Gemm>& gemms) {
  static std::vector<std::vector<float>> a, b, c;
  if (a.size() != gemms.size()) {
    a.clear(), b.clear(), c.clear();
    for (const auto& g : gemms) {
      a.emplace_back(static_cast<std::size_t>(g.m * g.k), 0.5f);
      b.emplace_back(static_cast<std::size_t>(g.k * g.n), 0.25f);
      c.emplace_back(static_cast<std::size_t>(g.m * g.n), 0.0f);
    }
  }
  auto start = std::chrono::steady_clock::now();
  for (std::size_t i = 0; i < gemms.size(); ++i) {
    const Gemm& g = gemms[i];
    cblas_sgemm(CblasRowMajor, g.ta ? CblasTrans : CblasNoTrans, g.tb ? CblasTrans : CblasNoTrans, g.m, g.n, g.k,
                1.0f, a[i].data(), g.ta ? g.m : g.k, b[i].data(), g.tb ? g.k : g.n, 0.0f, c[i].data(), g.n);
  }
  return ms_since(start);
}

int run(const Options& o) {
  set_cpu_threads(o.threads);
  const Device device = select_device(o.common.device, 0, false);
  std::shared_ptr<nn::Module> model;
  std::function<Tensor()> loss;
  std::unique_ptr<optim::Optimizer> optimizer;
  nlohmann::json settings = {{"model", o.model}, {"threads", o.threads}};
  std::vector<Gemm> gemms;
  checkpoint::NamedTensors inputs;

  if (o.model == "mlp") {
    model = nn::make_mlp(kMlpFeatures, o.width, kMlpHiddenLayers, 1, nn::Activation::relu, device, o.common.seed);
    Tensor x = Tensor::randn({o.width, kMlpFeatures}, o.common.seed + 1, device);
    Tensor y = Tensor::randn({o.width, 1}, o.common.seed + 2, device);
    loss = [&model, x, y] { return mse_loss((*model)(x), y); };
    optimizer = std::make_unique<optim::SGD>(model->parameters(), kMlpLr);
    std::vector<std::int64_t> sizes{kMlpFeatures};
    for (int l = 0; l < kMlpHiddenLayers; ++l) sizes.push_back(o.width);
    sizes.push_back(1);
    gemms = mlp_gemms(o.width, sizes);
    settings.update({{"width", o.width}, {"batch", o.width}, {"features", kMlpFeatures},
                     {"hidden_layers", kMlpHiddenLayers}, {"activation", "relu"}, {"loss", "mse"},
                     {"optimizer", "sgd"}, {"lr", kMlpLr}});
    inputs = {{"input.x", x}, {"input.y", y}};
  } else {
    cli::ModelOptions defaults;  // the chapters' default GPT on the addition task
    auto gpt = nn::gpt_task(defaults.gpt, defaults.digits, o.batch, 0, device, o.common.seed);
    model = gpt.task.make_model(o.common.seed);
    std::vector<std::int64_t> samples(static_cast<std::size_t>(o.batch));
    for (std::int64_t i = 0; i < o.batch; ++i) samples[static_cast<std::size_t>(i)] = i;
    auto batch = gpt.data->batch(samples, device);
    loss = [&model, batch] { return cross_entropy((*model)(batch.ids), batch.targets, data::AdditionTask::kIgnore); };
    optimizer = std::make_unique<optim::Adam>(optim::weight_decay_groups(model->parameters(), kGptWeightDecay), kGptLr,
                                              0.9f, 0.95f, 1e-8f, true);
    const auto& c = gpt.config;
    settings.update({{"n_layer", c.n_layer}, {"n_head", c.n_head}, {"n_embd", c.n_embd},
                     {"block_size", c.block_size}, {"vocab_size", c.vocab_size}, {"batch", o.batch},
                     {"tokens", batch.ids.numel()}, {"loss", "cross_entropy"}, {"optimizer", "adamw"},
                     {"lr", kGptLr}, {"betas", {0.9, 0.95}}, {"eps", 1e-8}, {"weight_decay", kGptWeightDecay}});
    inputs = {{"input.ids", batch.ids}, {"input.targets", batch.targets}};
  }
  settings["parameters"] = model->parameter_count();

  if (!o.save_init.empty()) {
    checkpoint::NamedTensors tensors = model->named_parameters();
    tensors.insert(tensors.end(), inputs.begin(), inputs.end());
    checkpoint::save_safetensors(o.save_init, tensors, {{"bench", settings.dump()}});
  }

  std::vector<double> losses, step_ms, gemm_ms;
  for (int step = 0; step < o.warmup + o.steps; ++step) {
    auto start = std::chrono::steady_clock::now();
    Tensor l = loss();
    l.backward();
    optimizer->step();
    optimizer->zero_grad();
    sync(device);
    const double ms = ms_since(start);
    if (step < o.check_steps) losses.push_back(l.item());
    if (step < o.warmup) continue;
    step_ms.push_back(ms);
    if (!gemms.empty() && device == Device::cpu) gemm_ms.push_back(time_gemms(gemms));  // alternating, same run
  }

  nlohmann::json result = settings;
  result["device"] = device_name(device);
  result["step_ms"] = median(step_ms);
  result["losses"] = losses;
  if (!gemm_ms.empty()) {
    result["gemm_ms"] = median(gemm_ms);
    result["step_over_gemm"] = median(step_ms) / median(gemm_ms);
  }
  if (o.json) {
    std::printf("%s\n", result.dump().c_str());
  } else {
    std::printf("%s on %s, %d thread(s), %lld parameters: step %.3f ms (median of %d)\n", o.model.c_str(),
                device_name(device), o.threads, static_cast<long long>(model->parameter_count()), median(step_ms),
                o.steps);
    if (!gemm_ms.empty())
      std::printf("  its GEMMs alone (OpenBLAS, same shapes): %.3f ms; step / GEMMs = %.2f\n", median(gemm_ms),
                  median(step_ms) / median(gemm_ms));
    std::printf("  first losses:");
    for (double l : losses) std::printf(" %.7g", l);
    std::printf("\n");
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"Times one training step of the course's MLP or GPT (and, for the MLP, its GEMMs alone)"};
  app.add_option("--model", o.model, "mlp or gpt")->check(CLI::IsMember({"mlp", "gpt"}));
  app.add_option("--width", o.width, "the MLP's hidden width, also its batch")->check(cli::PositiveInteger);
  app.add_option("--batch", o.batch, "the GPT's batch of addition problems")->check(cli::PositiveInteger);
  app.add_option("--threads", o.threads, "CPU threads (GEMM and element-wise kernels)")->check(cli::PositiveInteger);
  app.add_option("--steps", o.steps, "timed steps")->check(cli::PositiveInteger);
  app.add_option("--warmup", o.warmup, "untimed steps first")->check(CLI::NonNegativeNumber);
  app.add_option("--check-steps", o.check_steps, "losses reported, from the first step")->check(CLI::NonNegativeNumber);
  app.add_option("--save-init", o.save_init, "write the initial weights and the batch here (safetensors)");
  app.add_flag("--json", o.json, "one JSON line instead of text");
  cli::add_common_options(app, o.common);
  return cli::run(app, argc, argv, [&] { return run(o); });
}
