// Matmul and one MLP training step in GFLOP/s, beside OpenBLAS sgemm alone in the same run, to
// show how much the library (tensor allocation, dispatch, autograd) adds on top of the BLAS call.
//   ./build/release/benchmarks/bench_matmul [--device=cuda]   (GPU rows need a usable GPU)
//   ./build/release/benchmarks/bench_matmul --benchmark_min_time=0.3 --benchmark_filter=Sgemm
// (Debian's Google Benchmark 1.7 takes the minimum time as a plain number of seconds, without "s".)
#include <benchmark/benchmark.h>
#include <cblas.h>

#include "common/core/cuda_runtime.h"
#include "common/nn/layers.h"
#include "common/ops/ops.h"
#include "common/optim/optimizer.h"

using namespace course;

namespace {

void set_flops(benchmark::State& state, double flops_per_iteration) {
  state.counters["GFLOP/s"] = benchmark::Counter(flops_per_iteration * static_cast<double>(state.iterations()) / 1e9,
                                                 benchmark::Counter::kIsRate);
}

void sync(Device device) {
#if COURSE_HAVE_CUDA
  if (device == Device::cuda) cuda::synchronize();
#else
  (void)device;
#endif
}

bool skip_without(Device device, benchmark::State& state) {
  if (device == Device::cuda && !cuda_usable()) {
    state.SkipWithError("no usable GPU");
    return true;
  }
  return false;
}

void BM_OpenBlasSgemm(benchmark::State& state) {
  const auto n = state.range(0);
  std::vector<float> a(n * n, 1.0f), b(n * n, 0.5f), c(n * n);
  for (auto _ : state) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
    benchmark::DoNotOptimize(c.data());
  }
  set_flops(state, 2.0 * n * n * n);
}

void BM_LibraryMatmul(benchmark::State& state, Device device) {
  if (skip_without(device, state)) return;
  const auto n = state.range(0);
  Tensor a = Tensor::randn({n, n}, 1, device), b = Tensor::randn({n, n}, 2, device);
  for (auto _ : state) {
    Tensor c = matmul(a, b);
    sync(device);
    benchmark::DoNotOptimize(c.data());
  }
  set_flops(state, 2.0 * n * n * n);
}

// One step of chapter 01's MLP: forward, backward, SGD update, zero_grad.
void BM_MlpTrainStep(benchmark::State& state, Device device) {
  if (skip_without(device, state)) return;
  const std::int64_t batch = state.range(0), hidden = state.range(1), features = 16;
  const int layers = 3;
  auto mlp = nn::make_mlp(features, hidden, layers, 1, nn::Activation::relu, device, 1);
  optim::SGD sgd(mlp->parameters(), 1e-3f);
  Tensor x = Tensor::randn({batch, features}, 3, device), y = Tensor::randn({batch, 1}, 4, device);
  for (auto _ : state) {
    mse_loss((*mlp)(x), y).backward();
    sgd.step();
    sgd.zero_grad();
    sync(device);
  }
  // Forward 2*B*P multiply-adds over the weights, backward twice that.
  set_flops(state, 6.0 * static_cast<double>(batch) * static_cast<double>(mlp->parameter_count()));
  state.counters["samples/s"] = benchmark::Counter(static_cast<double>(batch * state.iterations()),
                                                   benchmark::Counter::kIsRate);
}

}  // namespace

BENCHMARK(BM_OpenBlasSgemm)->Arg(128)->Arg(512)->Arg(1024)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_LibraryMatmul, cpu, Device::cpu)->Arg(128)->Arg(512)->Arg(1024)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_LibraryMatmul, cuda, Device::cuda)->Arg(128)->Arg(512)->Arg(1024)->Arg(4096)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_MlpTrainStep, cpu, Device::cpu)->Args({256, 256})->Args({1024, 1024})->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_MlpTrainStep, cuda, Device::cuda)->Args({256, 256})->Args({1024, 1024})->Args({4096, 4096})->Unit(benchmark::kMillisecond);
