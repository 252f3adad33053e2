// Measuring this machine, and the cluster it makes (calibration.h).
#include "common/planner/calibration.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <cmath>
#include <stdexcept>
#include <thread>
#include <tuple>

#include "common/kernels/kernels.h"
#include "common/ops/ops.h"

namespace course::planner {
namespace {

using Clock = std::chrono::steady_clock;

// The best of three trials of `work`, each repeated until it has run 10 ms, in seconds per call.
template <class Work>
double seconds_per_call(Work&& work) {
  double best = 1e300;
  for (int trial = 0; trial < 3; ++trial) {
    int calls = 0;
    const auto begin = Clock::now();
    double elapsed = 0;
    do {
      work();
      ++calls;
      elapsed = std::chrono::duration<double>(Clock::now() - begin).count();
    } while (elapsed < 0.01);
    best = std::min(best, elapsed / calls);
  }
  return best;
}

Tensor parameter(const Shape& shape, float value) {
  Tensor t = Tensor::full(shape, value);
  t.set_requires_grad(true);
  return t;
}

// The linear layer at the sizes a small GPT's layers run (tokens x width x width, up to 4 x the width)
// and squares up to 512: from 25 thousand FLOPs to 800 million, forward and backward.
GemmCurve measure_linear() {
  std::vector<double> flops, seconds;
  auto time = [&](std::int64_t m, std::int64_t n, std::int64_t k) {
    Tensor x = parameter({m, k}, 0.5f), w = parameter({n, k}, 0.25f), b = parameter({n}, 0.1f);
    seconds.push_back(seconds_per_call([&] {
      sum(linear(x, w, b)).backward();
      x.zero_grad(), w.zero_grad(), b.zero_grad();
    }));
    flops.push_back(6.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k));
  };
  for (const std::int64_t m : {16, 64, 256, 1024})
    for (const std::int64_t k : {16, 64, 256})
      for (const std::int64_t n : {16, 64, 256}) time(m, n, k);
  for (const std::int64_t n : {384, 512}) time(n, n, n);
  return fit_gemm_curve(flops, seconds);
}

// A GPT-2 block's element-wise ops on [N, h]: two layer norms, GELU (tanh) over [N, 4h], two residual
// additions, forward and backward, at three token counts: (fixed, per token-channel).
std::pair<double, double> measure_elementwise() {
  constexpr std::int64_t h = 64;
  std::vector<double> elements, seconds;
  for (const std::int64_t n : {64, 512, 4096}) {
    Tensor x = parameter({n, h}, 0.5f), wide = parameter({n, 4 * h}, 0.3f), gain = parameter({h}, 1.0f),
           shift = parameter({h}, 0.0f);
    seconds.push_back(seconds_per_call([&] {
      Tensor y = add(layer_norm(x, gain, shift), x);
      Tensor z = add(layer_norm(y, gain, shift), y);
      add(sum(z), sum(gelu(wide, GeluApproximate::tanh))).backward();
      x.zero_grad(), wide.zero_grad(), gain.zero_grad(), shift.zero_grad();
    }));
    elements.push_back(static_cast<double>(n * h));
  }
  return fit_line(elements, seconds);
}

// Causal attention, forward and backward, per sequence-head pair: 8 sequences of 16 tokens, 4 heads of 16.
double measure_attention() {
  constexpr std::int64_t b = 8, t = 16, heads = 4, c = 64;
  Tensor qkv = parameter({b, t, 3 * c}, 0.1f);
  return seconds_per_call([&] {
           sum(scaled_dot_product_attention(qkv, heads)).backward();
           qkv.zero_grad();
         }) /
         static_cast<double>(b * heads);
}

double measure_bandwidth() {
  const std::size_t n = 16u << 20;  // 64 MiB of floats
  std::vector<float> in(n, 1.0f), out(n, 0.0f);
  Kernels& cpu = kernels(Device::cpu);
  return 2.0 * static_cast<double>(n) * sizeof(float) / seconds_per_call([&] { cpu.copy(out.data(), in.data(), n); });
}

OpRates measure_rates() {
  OpRates r;
  r.linear = measure_linear();
  std::tie(r.elementwise_fixed_seconds, r.elementwise_seconds_per_element) = measure_elementwise();
  r.attention_seconds_per_head = measure_attention();
  r.bandwidth = measure_bandwidth();
  return r;
}

// A chain of 200 additions on 8 elements, forward and backward: what an op costs beyond its arithmetic.
double measure_op() {
  constexpr int kChain = 200;
  Tensor x = parameter({8}, 0.5f);
  return seconds_per_call([&] {
           Tensor y = x;
           for (int i = 0; i < kChain; ++i) y = add(y, x);
           sum(y).backward();
           x.zero_grad();
         }) /
         kChain;
}

double positive(const nlohmann::json& j, const char* key) {
  if (!j.contains(key) || !j[key].is_number() || !(j[key].get<double>() > 0))
    throw std::invalid_argument(std::string("calibration: '") + key + "' must be a positive number");
  return j[key].get<double>();
}

}  // namespace

std::pair<double, double> fit_line(const std::vector<double>& x, const std::vector<double>& seconds) {
  if (x.size() != seconds.size() || x.size() < 2) throw std::invalid_argument("fit_line: two points or more");
  // Weighted by 1 / seconds^2: each point's relative error counts alike.
  double sw = 0, swx = 0, swxx = 0, swt = 0, swxt = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double w = 1 / (seconds[i] * seconds[i]);
    sw += w, swx += w * x[i], swxx += w * x[i] * x[i], swt += w * seconds[i], swxt += w * x[i] * seconds[i];
  }
  const double det = sw * swxx - swx * swx;
  double a = (swxx * swt - swx * swxt) / det, b = (sw * swxt - swx * swt) / det;
  if (a < 0) a = 0, b = swxt / swxx;  // no fixed part: the slope alone
  return {a, b};
}

GemmCurve fit_gemm_curve(const std::vector<double>& flops, const std::vector<double>& seconds) {
  const auto [a, b] = fit_line(flops, seconds);
  return {1 / b, a / b};
}

Calibration measure_this_machine(const Link& link) {
  Calibration c;
  c.cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  c.memory_bytes = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGE_SIZE));
  c.link = link;
  const int before = cpu_threads();
  set_cpu_threads(1);
  c.one_thread = measure_rates();
  c.op_seconds = measure_op();
  set_cpu_threads(c.cores);
  c.all_cores = measure_rates();
  set_cpu_threads(before);
  return c;
}

namespace {
nlohmann::json rates_json(const OpRates& r) {
  return {{"linear_flops_per_second", r.linear.flops_per_second},
          {"linear_half_rate_flops", r.linear.half_rate_flops},
          {"elementwise_fixed_seconds", r.elementwise_fixed_seconds},
          {"elementwise_seconds_per_element", r.elementwise_seconds_per_element},
          {"attention_seconds_per_head", r.attention_seconds_per_head},
          {"bandwidth", r.bandwidth}};
}
OpRates rates_from(const nlohmann::json& j, const char* key) {
  if (!j.contains(key) || !j[key].is_object())
    throw std::invalid_argument(std::string("calibration: '") + key + "' must be an object");
  const nlohmann::json& r = j[key];
  OpRates out;
  out.linear = {positive(r, "linear_flops_per_second"), r.value("linear_half_rate_flops", 0.0)};
  out.elementwise_fixed_seconds = r.value("elementwise_fixed_seconds", 0.0);
  out.elementwise_seconds_per_element = positive(r, "elementwise_seconds_per_element");
  out.attention_seconds_per_head = positive(r, "attention_seconds_per_head");
  out.bandwidth = positive(r, "bandwidth");
  return out;
}
}  // namespace

nlohmann::json to_json(const Calibration& c) {
  return {{"cores", c.cores},
          {"one_thread", rates_json(c.one_thread)},
          {"all_cores", rates_json(c.all_cores)},
          {"op_seconds", c.op_seconds},
          {"memory_bytes", c.memory_bytes},
          {"alpha_seconds", c.link.alpha_seconds},
          {"link_bytes_per_second", c.link.bytes_per_second}};
}

Calibration calibration_from_json(const nlohmann::json& j) {
  Calibration c;
  c.cores = static_cast<int>(positive(j, "cores"));
  c.one_thread = rates_from(j, "one_thread");
  c.all_cores = rates_from(j, "all_cores");
  c.op_seconds = positive(j, "op_seconds");
  c.memory_bytes = positive(j, "memory_bytes");
  c.link = {positive(j, "alpha_seconds"), positive(j, "link_bytes_per_second")};
  return c;
}

Calibration read_calibration(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::invalid_argument(path + " cannot be read");
  const auto j = nlohmann::json::parse(in, nullptr, false);
  if (j.is_discarded() || !j.is_object()) throw std::invalid_argument(path + " is not a calibration's JSON (benchmarks/plan --calibrate writes one)");
  try {
    return calibration_from_json(j);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(path + ": " + e.what());
  }
}

Cluster this_machine(const Calibration& c, int ranks, int threads_alone) {
  Cluster out;
  out.name = "this machine: " + std::to_string(ranks) + " rank" + (ranks > 1 ? "s" : "") + " on " +
             std::to_string(c.cores) + " core" + (c.cores > 1 ? "s" : "");
  out.gpus_per_node = ranks;
  out.nodes = 1;
  // A rank alone has its threads; ranks sharing the machine one thread each, and when they outnumber the
  // cores, the share of a core that the most crowded core leaves each of its ranks (ceil(ranks / cores)
  // of them): every step waits for the slowest rank at its collectives (their fixed costs stretched alike).
  const bool alone = ranks == 1 && threads_alone > 1;
  const double share = alone ? 1.0 : 1.0 / std::ceil(static_cast<double>(ranks) / c.cores);
  const OpRates& r = alone ? c.all_cores : c.one_thread;
  DeviceProfile& d = out.device;
  d.name = "CPU rank";
  d.peak_flops_32 = d.peak_flops_16 = r.linear.flops_per_second * share;  // 16 bits widen to float32 here (AVX2)
  d.gemm_efficiency = 1;  // the curve is measured: its asymptote is the peak
  // The cost model prices a layer's linear ops as three GEMMs each (forward, and backward's two), each
  // with a fixed part; the measured fixed part is the whole op's.
  d.half_efficiency_flops = r.linear.half_rate_flops / 3;
  d.memory_bandwidth = r.bandwidth * share;
  d.memory_bytes = c.memory_bytes / ranks;
  d.op_seconds = c.op_seconds / share;
  d.elementwise_fixed_seconds = r.elementwise_fixed_seconds / share;
  d.elementwise_seconds_per_element = r.elementwise_seconds_per_element / share;
  d.attention_seconds_per_head = r.attention_seconds_per_head / share;
  out.intra = out.inter = c.link;
  return out;
}

}  // namespace course::planner
