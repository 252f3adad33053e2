// One training step (forward, backward, optimizer step, zero_grad) of the course's MLP or GPT, timed;
// for the MLP also the step's GEMMs alone, called straight on the library's GEMM (oneDNN or OpenBLAS,
// common/kernels/cpu_gemm.h) in the same run, so the ratio
// step / GEMMs says how much the library adds on top of the arithmetic it cannot avoid.
//   bench_step --model mlp --width 1024 --threads 2
//   bench_step --model gpt --threads 1 --json                  the chapters' default GPT on addition
//   bench_step --model gpt --n-layer 6 --n-head 6 --n-embd 384 --block-size 256 --batch 8 --profile
//   bench_step --model gpt ... --sdpa math                     attention keeping its probabilities
// With --block-size the GPT reads random tokens of --vocab characters (65, a character model's) in
// windows of that length: the shapes people train, where attention, layer norm and the embeddings
// weigh more than on the addition task's 8-token problems. --profile prints the step op by op,
// forward and backward (common/autograd/profiler.h). The GPT's step also prints tokens/s, TFLOP/s and MFU
// (common/metrics/mfu.h: nanoGPT's FLOP count; the peak from the GPU's name, or --peak-tflops).
// --save-init FILE writes the initial weights and the batch (safetensors, with the run's settings in its
// metadata): benchmarks/peer/peer_step.py loads them into PyTorch, runs the same step, and compares
// both the time and the first losses.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>

#include <CLI/CLI.hpp>

#include "common/core/cpu_cores.h"
#include "common/autograd/profiler.h"
#include "common/checkpoint/parameters.h"
#include "common/cli/cli.h"
#include "common/cli/model_options.h"
#include "common/cli/precision_options.h"
#include "common/core/errors.h"
#include "common/core/cuda_runtime.h"
#include "common/kernels/cpu_gemm.h"
#include "common/kernels/flash.h"
#include "common/kernels/kernels.h"
#include "common/metrics/mfu.h"
#include "common/nn/tasks.h"
#include "common/ops/autocast.h"
#include "common/ops/sdpa_kernel.h"
#include "common/optim/grad_scaler.h"
#include "common/optim/optimizer.h"
#include "common/tensor/random.h"

using namespace course;

namespace {

struct Options {
  std::string model = "mlp";
  std::int64_t width = 256;  // the MLP's hidden width, and its batch
  std::int64_t batch = 240;  // the GPT's batch (chapter 04's global batch)
  nn::GPTConfig gpt{2, 4, 64, 0, 65, 0.0f};  // --n-layer, --n-head, --n-embd; --block-size 0: the addition task
  bool profile = false;
  int threads = 1;
  int steps = 30, warmup = 3, check_steps = 3;
  std::string save_init;
  std::string sdpa = "auto";  // the GPT's attention kernel: auto (the device's default), math or flash
  bool json = false;
  double peak_tflops = 0;  // the device's peak for MFU; 0: from the GPU's name (common/metrics/mfu.h)
  cli::CommonOptions common;
  cli::PrecisionOptions precision;  // --precision: the forward under autocast, fp16's loss scale
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
    cpu::sgemm(g.ta, g.tb, g.m, g.n, g.k, 1.0f, a[i].data(), g.ta ? g.m : g.k, b[i].data(), g.tb ? g.k : g.n, 0.0f,
               c[i].data(), g.n);
  }
  return ms_since(start);
}

int run(const Options& o) {
  const CpuCores cores = place_cpu_threads(1);  // a benchmark runs alone: unbound from mpirun's one core
  set_cpu_threads(o.threads);
  const Device device = select_device(o.common.device, 0, false);
  std::shared_ptr<nn::Module> model;
  std::function<Tensor()> loss;
  std::unique_ptr<optim::Optimizer> optimizer;
  const char* recompute[] = {"none", "selective", "full"};
  nlohmann::json settings = {{"model", o.model}, {"threads", o.threads}, {"cores_allowed", cores.allowed},
                             {"cores", cores.machine}, {"precision", o.precision.precision},
                             {"recompute", recompute[static_cast<int>(o.gpt.recompute)]}};
  std::vector<Gemm> gemms;
  checkpoint::NamedTensors inputs;
  SdpBackend attention = SdpBackend::math;
  double flops_per_step = 0;  // the GPT's, counted as nanoGPT's estimate_mfu
  std::int64_t tokens = 0;

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
    nn::GPTConfig c = o.gpt;
    if (c.n_embd % c.n_head != 0)
      throw UsageError("--n-head: " + std::to_string(c.n_head) + " does not divide --n-embd " + std::to_string(c.n_embd));
    Tensor ids, targets;
    if (c.block_size == 0) {  // the chapters' default GPT on the addition task
      cli::ModelOptions defaults;
      c.vocab_size = defaults.gpt.vocab_size;
      auto gpt = nn::gpt_task(c, defaults.digits, o.batch, 0, device, o.common.seed);
      c = gpt.config;
      std::vector<std::int64_t> samples(static_cast<std::size_t>(o.batch));
      for (std::int64_t i = 0; i < o.batch; ++i) samples[static_cast<std::size_t>(i)] = i;
      auto batch = gpt.data->batch(samples, device);
      ids = batch.ids, targets = batch.targets;
    } else {  // random windows of a text of vocab_size characters: every position is a target
      c.check();
      std::vector<float> tokens(static_cast<std::size_t>(o.batch * (c.block_size + 1)));
      for (std::size_t i = 0; i < tokens.size(); ++i)
        tokens[i] = static_cast<float>(random_bits(o.common.seed + 3, i) % static_cast<std::uint64_t>(c.vocab_size));
      std::vector<float> in, next;
      for (std::int64_t b = 0; b < o.batch; ++b) {
        const auto row = tokens.begin() + b * (c.block_size + 1);
        in.insert(in.end(), row, row + c.block_size);
        next.insert(next.end(), row + 1, row + c.block_size + 1);
      }
      ids = Tensor::from_host(in, {o.batch, c.block_size}, device);
      targets = Tensor::from_host(next, {o.batch * c.block_size}, device);
    }
    const std::int64_t head_size = c.n_embd / c.n_head;
    if (o.sdpa == "flash" && head_size > math::kFlashMaxHeadSize)
      throw UsageError("--sdpa: flash takes head sizes up to " + std::to_string(math::kFlashMaxHeadSize) + ", got " +
                       std::to_string(head_size) + " (--n-embd / --n-head)");
    attention = o.sdpa == "math"    ? SdpBackend::math
                : o.sdpa == "flash" ? SdpBackend::flash_attention
                                    : sdp_backend(device, head_size);
    settings["attention"] = attention == SdpBackend::flash_attention ? "flash_attention" : "math";
    model = std::make_shared<nn::GPT>(c, device, o.common.seed);
    tokens = ids.numel();
    flops_per_step = metrics::gpt_flops_per_token({model->parameter_count(), c.block_size * c.n_embd, c.n_layer,
                                                   c.n_head, c.n_embd, c.block_size}) *
                     static_cast<double>(tokens);
    loss = [&model, ids, targets] { return cross_entropy((*model)(ids), targets, data::AdditionTask::kIgnore); };
    optimizer = std::make_unique<optim::Adam>(optim::weight_decay_groups(model->parameters(), kGptWeightDecay), kGptLr,
                                              0.9f, 0.95f, 1e-8f, true);
    settings.update({{"n_layer", c.n_layer}, {"n_head", c.n_head}, {"n_embd", c.n_embd},
                     {"block_size", c.block_size}, {"vocab_size", c.vocab_size}, {"batch", o.batch},
                     {"tokens", ids.numel()}, {"loss", "cross_entropy"}, {"optimizer", "adamw"},
                     {"lr", kGptLr}, {"betas", {0.9, 0.95}}, {"eps", 1e-8}, {"weight_decay", kGptWeightDecay}});
    inputs = {{"input.ids", ids}, {"input.targets", targets}};
  }
  settings["parameters"] = model->parameter_count();

  if (!o.save_init.empty()) {
    checkpoint::NamedTensors tensors = model->named_parameters();
    tensors.insert(tensors.end(), inputs.begin(), inputs.end());
    checkpoint::save_safetensors(o.save_init, tensors, {{"bench", settings.dump()}});
  }

  std::vector<double> losses, step_ms, gemm_ms;
  std::unique_ptr<autograd::profiler::Profile> profile;
  SdpaKernel attention_kernel(attention);  // the GPT's choice for every step (the MLP has no attention)
  optim::GradScalerOptions scaling;
  scaling.enabled = o.precision.dtype() == DType::float16;
  scaling.init_scale = o.precision.loss_scale;
  optim::GradScaler scaler(scaling);
  std::int64_t activation_peak = 0;  // the most bytes of activations alive during a step, above the step's start
  for (int step = 0; step < o.warmup + o.steps; ++step) {
    if (o.profile && step == o.warmup) profile = std::make_unique<autograd::profiler::Profile>(device);
    const std::int64_t before = memory_stats(device).current_of(MemoryCategory::activations);
    reset_peak_memory(device);
    auto start = std::chrono::steady_clock::now();
    Tensor l;
    {
      Autocast autocast(o.precision.dtype());  // fp32: off
      l = loss();
    }
    scaler.scale(l).backward();
    {
      autograd::profiler::RecordFunction timed(o.model == "gpt" ? "adamw step" : "sgd step");
      scaler.step(*optimizer);  // fp16: unscaled first, skipped on overflow; otherwise optimizer->step()
      scaler.update();
      optimizer->zero_grad();
    }
    sync(device);
    const double ms = ms_since(start);
    activation_peak = std::max(activation_peak, memory_stats(device).peak_of(MemoryCategory::activations) - before);
    if (step < o.check_steps) losses.push_back(l.item());
    if (step < o.warmup) continue;
    step_ms.push_back(ms);
    if (!gemms.empty() && device == Device::cpu) gemm_ms.push_back(time_gemms(gemms));  // alternating, same run
  }

  nlohmann::json result = settings;
  result["device"] = device_name(device);
  if (device == Device::cpu) result["gemm_library"] = cpu::gemm_library();
  result["step_ms"] = median(step_ms);
  result["activation_peak_bytes"] = activation_peak;
  result["losses"] = losses;
  // Throughput and MFU: the model's FLOPs per step over the median step, against the device's peak for the
  // GEMMs' type (a GPU's from its name, or --peak-tflops; a CPU's only from --peak-tflops).
  std::string peak_source = "--peak-tflops";
  double peak = o.peak_tflops;
#if COURSE_HAVE_CUDA
  if (peak == 0 && device == Device::cuda) {
    peak_source = cuda::device_product_name();
    peak = metrics::peak_tflops(peak_source, o.precision.dtype(), allow_tf32());
  }
#endif
  const double achieved_tflops = flops_per_step > 0 ? flops_per_step / (median(step_ms) * 1e-3) / 1e12 : 0.0;
  if (tokens > 0) {
    result["tokens_per_second"] = static_cast<double>(tokens) / (median(step_ms) * 1e-3);
    result["tflops"] = achieved_tflops;
    if (peak > 0) result.update({{"peak_tflops", peak}, {"peak_of", peak_source}, {"mfu", achieved_tflops / peak}});
  }
  if (!gemm_ms.empty()) {
    result["gemm_ms"] = median(gemm_ms);
    result["step_over_gemm"] = median(step_ms) / median(gemm_ms);
  }
  // The profile, per step: each op's forward and backward milliseconds (the step's mean over the timed
  // steps; the profiler's own synchronisation makes the profiled steps a little slower than step_ms).
  nlohmann::json ops = nlohmann::json::array();
  double profiled_ms = 0;
  if (profile) {
    for (const auto& op : profile->table()) {
      ops.push_back({{"op", op.name}, {"forward_ms", op.forward_ms / o.steps}, {"backward_ms", op.backward_ms / o.steps}});
      profiled_ms += (op.forward_ms + op.backward_ms) / o.steps;
    }
    result["ops"] = ops;
  }
  if (o.json) {
    std::printf("%s\n", result.dump().c_str());
  } else {
    std::printf("%s on %s%s%s, %d thread(s) on %d of %d cores, %lld parameters: step %.3f ms (median of %d)\n",
                o.model.c_str(), device_name(device), device == Device::cpu ? ", GEMMs on " : "",
                device == Device::cpu ? cpu::gemm_library() : "", o.threads, cores.allowed, cores.machine,
                static_cast<long long>(model->parameter_count()), median(step_ms), o.steps);
    std::printf("  %s, recompute %s%s; activations at their peak %.2f MiB\n", cli::precision_description(o.precision).c_str(),
                recompute[static_cast<int>(o.gpt.recompute)],
                o.model == "gpt" ? (attention == SdpBackend::flash_attention ? ", FlashAttention" : ", math attention") : "",
                static_cast<double>(activation_peak) / (1024.0 * 1024.0));
    if (tokens > 0) {
      std::printf("  %.0f tokens/s, %.3g TFLOP/s (nanoGPT's count, %.3g GFLOP a step)", result["tokens_per_second"].get<double>(),
                  achieved_tflops, flops_per_step / 1e9);
      if (peak > 0) std::printf("; MFU %.3f of %.1f TFLOP/s (%s)", achieved_tflops / peak, peak, peak_source.c_str());
      std::printf("\n");
    }
    if (!gemm_ms.empty())
      std::printf("  its GEMMs alone (same library, same shapes): %.3f ms; step / GEMMs = %.2f\n", median(gemm_ms),
                  median(step_ms) / median(gemm_ms));
    std::printf("  first losses:");
    for (double l : losses) std::printf(" %.7g", l);
    std::printf("\n");
    if (profile) {
      std::printf("  per step, op by op (profiled):\n  %-18s %10s %10s %7s\n", "op", "fwd ms", "bwd ms", "share");
      for (const auto& op : ops) {
        const double both = op["forward_ms"].get<double>() + op["backward_ms"].get<double>();
        std::printf("  %-18s %10.3f %10.3f %6.1f%%\n", op["op"].get<std::string>().c_str(), op["forward_ms"].get<double>(),
                    op["backward_ms"].get<double>(), 100.0 * both / median(step_ms));
      }
      std::printf("  %-18s %21.3f %6.1f%%  (the engine, allocation, everything between ops)\n", "outside the ops",
                  median(step_ms) - profiled_ms, 100.0 * (median(step_ms) - profiled_ms) / median(step_ms));
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"Times one training step of the course's MLP or GPT (and, for the MLP, its GEMMs alone)"};
  app.add_option("--model", o.model, "mlp or gpt")->check(CLI::IsMember({"mlp", "gpt"}));
  app.add_option("--width", o.width, "the MLP's hidden width, also its batch")->check(cli::PositiveInteger);
  app.add_option("--batch", o.batch, "the GPT's batch: addition problems, or windows with --block-size")
      ->check(cli::PositiveInteger);
  app.add_option("--n-layer", o.gpt.n_layer, "GPT blocks")->check(CLI::Range(1, 64));
  app.add_option("--n-head", o.gpt.n_head, "GPT attention heads (must divide --n-embd)")->check(CLI::Range(1, 256));
  app.add_option("--n-embd", o.gpt.n_embd, "GPT width")->check(CLI::Range(1, 1 << 14));
  app.add_option("--block-size", o.gpt.block_size, "GPT windows of this many random tokens (0: the addition task)")
      ->check(CLI::Range(0, 1 << 16));
  app.add_option("--vocab", o.gpt.vocab_size, "the random tokens' vocabulary, with --block-size")
      ->check(CLI::Range(2, 1 << 20));
  app.add_option_function<std::string>(
         "--recompute", [&o](const std::string& value) { o.gpt.recompute = nn::recompute_named(value); },
         "the GPT's activation recomputation: none, selective or full")
      ->check(CLI::IsMember({"none", "selective", "full"}))
      ->default_str("none");
  app.add_option("--sdpa", o.sdpa,
                 "the GPT's attention kernel, as torch's sdpa_kernel: flash (FlashAttention-2), math (keeps the "
                 "probabilities) or auto (a GPU's flash, the CPU's math)")
      ->check(CLI::IsMember({"auto", "math", "flash"}));
  cli::refuse_inert(app, "--sdpa", [&o] { return o.model == "gpt" ? std::string() : "does nothing without --model gpt (the MLP has no attention)"; });
  app.add_flag("--profile", o.profile, "time the step op by op, forward and backward");
  cli::add_precision_options(app, o.precision);
  app.add_option("--threads", o.threads, "CPU threads (GEMM and element-wise kernels)")->check(cli::PositiveInteger);
  app.add_option("--steps", o.steps, "timed steps")->check(cli::PositiveInteger);
  app.add_option("--warmup", o.warmup, "untimed steps first")->check(CLI::NonNegativeNumber);
  app.add_option("--check-steps", o.check_steps, "losses reported, from the first step")->check(CLI::NonNegativeNumber);
  app.add_option("--save-init", o.save_init, "write the initial weights and the batch here (safetensors)");
  app.add_flag("--json", o.json, "one JSON line instead of text");
  app.add_option("--peak-tflops", o.peak_tflops,
                 "the device's peak TFLOP/s for the GPT's MFU (default: a GPU's from its name; none on a CPU)")
      ->check(cli::PositiveFinite);
  cli::add_common_options(app, o.common);
  return cli::run(app, argc, argv, [&] { return run(o); });
}
