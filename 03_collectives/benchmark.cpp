// Timing, checking and the alpha-beta cost model for chapter 03.
#include "benchmark.h"

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>

#include "common/comm/agree.h"  // all_reduce_scalar
#include "common/comm/algorithms.h"
#include "common/core/log.h"
#include "common/metrics/timer.h"

namespace course::chapter03 {
namespace {

namespace algo = comm::algorithms;
using Clock = std::chrono::steady_clock;

// Inputs are chosen so that every answer is known in closed form and exact in float32: rank r's
// element i is (r + 1) * (i % 13 + 1), so sums over any practical rank count are small integers.
float value(int rank, std::size_t i) { return static_cast<float>((rank + 1) * static_cast<int>(i % 13 + 1)); }
float rank_sum(int ranks) { return static_cast<float>(ranks * (ranks + 1) / 2); }

// How a collective's buffers relate to the row's size: one buffer of `count` elements (in place), or
// an input of count / n gathered into count, or count scattered into count / n.
enum class Layout { in_place, gather, scatter };

// One row kind of the table, declared as nccl-tests declares a collective: its bandwidth factor, its
// buffers, how it runs, and the alpha-beta model of its time (null: none, for the library's own call).
using Model = std::function<double(double bytes, const AlphaBeta&)>;
struct Case {
  std::string op, algorithm;
  double bus_factor;  // busbw = algbw * factor (nccl-tests' definitions)
  Layout layout;
  std::function<void(Tensor& input, Tensor& output)> run;
  Model model;
  bool root_only = false;  // only the root's output is defined (reduce)
};

// The closed-form output element i on rank `me`; `each` is the per-rank piece for gather and scatter.
float expected(const Case& k, std::size_t i, int me, int n, int root, std::size_t each) {
  if (k.op == "broadcast") return value(root, i);
  if (k.op == "all_gather") return value(static_cast<int>(i / each), i % each);
  if (k.op == "reduce_scatter")
    return rank_sum(n) * static_cast<float>((static_cast<std::size_t>(me) * each + i) % 13 + 1);
  return rank_sum(n) * static_cast<float>(i % 13 + 1);  // all_reduce, reduce
}

double rounds(int n) { return std::ceil(std::log2(static_cast<double>(n))); }

// `ordered`: a group of the same ranks that adds in the ring's order (Communicator::add_in_ring_order), whose
// all-reduce is the library's own ring: over MPI on one machine it travels through shared memory.
std::vector<Case> cases(comm::Communicator& c, comm::Communicator& ordered, int root) {
  const int n = c.size();
  const double steps = n - 1, ring = static_cast<double>(n - 1) / n;
  const std::string library = c.backend_name();
  auto p2p = [](double bytes, const AlphaBeta& m) { return m.alpha + bytes * m.beta; };
  // The models, from the README's table.
  Model ring_all_reduce = [=](double s, const AlphaBeta& m) { return 2 * steps * m.alpha + 2 * ring * s * m.beta; };
  Model ring_half = [=](double s, const AlphaBeta& m) { return steps * m.alpha + ring * s * m.beta; };
  Model tree = [=](double s, const AlphaBeta& m) { return rounds(n) * p2p(s, m); };
  Model naive = [=](double s, const AlphaBeta& m) { return steps * p2p(s, m); };
  Model twice_tree = [=](double s, const AlphaBeta& m) { return 2 * tree(s, m); };
  Model twice_naive = [=](double s, const AlphaBeta& m) { return 2 * naive(s, m); };
  const double ar = 2.0 * (n - 1) / n;
  using L = Layout;
  return {
      {"all_reduce", "ring", ar, L::in_place, [&c](Tensor& t, Tensor&) { algo::ring_all_reduce(c, t); },
       ring_all_reduce},
      {"all_reduce", "pipe", ar, L::in_place,
       [&c](Tensor& t, Tensor&) { algo::ring_all_reduce(c, t, comm::ReduceOp::sum, algo::kRingSegment); },
       ring_all_reduce},
      {"all_reduce", "tree", ar, L::in_place,
       [&c](Tensor& t, Tensor&) { algo::tree_reduce(c, t, 0), algo::tree_broadcast(c, t, 0); }, twice_tree},
      {"all_reduce", "naive", ar, L::in_place,
       [&c](Tensor& t, Tensor&) { algo::naive_reduce(c, t, 0), algo::naive_broadcast(c, t, 0); }, twice_naive},
      {"all_reduce", "ordered", ar, L::in_place, [&ordered](Tensor& t, Tensor&) { ordered.all_reduce(t); },
       ring_all_reduce},
      {"all_reduce", library, ar, L::in_place, [&c](Tensor& t, Tensor&) { c.all_reduce(t); }, nullptr},
      {"broadcast", "naive", 1, L::in_place, [&c, root](Tensor& t, Tensor&) { algo::naive_broadcast(c, t, root); },
       naive},
      {"broadcast", "tree", 1, L::in_place, [&c, root](Tensor& t, Tensor&) { algo::tree_broadcast(c, t, root); }, tree},
      {"broadcast", library, 1, L::in_place, [&c, root](Tensor& t, Tensor&) { c.broadcast(t, root); }, nullptr},
      {"reduce", "naive", 1, L::in_place, [&c, root](Tensor& t, Tensor&) { algo::naive_reduce(c, t, root); }, naive,
       true},
      {"reduce", "tree", 1, L::in_place, [&c, root](Tensor& t, Tensor&) { algo::tree_reduce(c, t, root); }, tree, true},
      {"reduce", library, 1, L::in_place, [&c, root](Tensor& t, Tensor&) { c.reduce(t, root); }, nullptr, true},
      {"all_gather", "ring", ring, L::gather, [&c](Tensor& i, Tensor& o) { algo::ring_all_gather(c, i, o); },
       ring_half},
      {"all_gather", library, ring, L::gather, [&c](Tensor& i, Tensor& o) { c.all_gather(i, o); }, nullptr},
      {"reduce_scatter", "ring", ring, L::scatter, [&c](Tensor& i, Tensor& o) { algo::ring_reduce_scatter(c, i, o); },
       ring_half},
      {"reduce_scatter", library, ring, L::scatter, [&c](Tensor& i, Tensor& o) { c.reduce_scatter(i, o); }, nullptr},
  };
}

double max_over_ranks(comm::Communicator& c, double seconds) {
  return comm::all_reduce_scalar(c, static_cast<float>(seconds), comm::ReduceOp::max);
}

}  // namespace

const std::set<std::string> kBenchmarkOps = {"all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter"};

AlphaBeta fit_alpha_beta(comm::Communicator& c, const BenchOptions& o, metrics::MetricsWriter& out) {
  AlphaBeta fit;
  if (c.size() < 2) return fit;
  // Ping-pong between ranks 0 and 1: half a round trip is one transfer of `bytes`.
  std::vector<double> xs, ys;
  for (std::size_t bytes = o.min_bytes; bytes <= o.max_bytes; bytes *= o.factor) {
    Tensor buffer = Tensor::zeros({static_cast<std::int64_t>(bytes / 4)});
    double seconds = 0;
    for (int i = 0; i < o.warmup + o.iters; ++i) {
      c.barrier();
      auto begin = Clock::now();
      if (c.rank() == 0) {
        c.send(buffer, 1);
        c.recv(buffer, 1);
      } else if (c.rank() == 1) {
        c.recv(buffer, 0);
        c.send(buffer, 0);
      }
      if (i >= o.warmup) seconds += std::chrono::duration<double>(Clock::now() - begin).count() / 2;
    }
    xs.push_back(static_cast<double>(bytes));
    ys.push_back(max_over_ranks(c, c.rank() <= 1 ? seconds / o.iters : 0.0));
    if (bytes > o.max_bytes / o.factor) break;
  }
  // Least squares for t = alpha + beta * bytes.
  double n = static_cast<double>(xs.size()), sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (std::size_t i = 0; i < xs.size(); ++i) sx += xs[i], sy += ys[i], sxx += xs[i] * xs[i], sxy += xs[i] * ys[i];
  double denominator = n * sxx - sx * sx;
  if (xs.size() < 2 || denominator <= 0) return fit;
  fit.beta = (n * sxy - sx * sy) / denominator;
  fit.alpha = std::max(0.0, (sy - fit.beta * sx) / n);
  fit.valid = fit.beta > 0;
  log("# alpha-beta fit from ping-pong between ranks 0 and 1: alpha = %.2f us, 1/beta = %.2f GB/s\n", fit.alpha * 1e6,
      fit.valid ? 1e-9 / fit.beta : 0.0);
  out.write({{"event", "alpha_beta"},
             {"alpha_us", fit.alpha * 1e6},
             {"beta_s_per_byte", fit.beta},
             {"bandwidth_gbps", fit.valid ? 1e-9 / fit.beta : 0.0}});
  return fit;
}

void report_device_bandwidth(comm::Communicator& c, const BenchOptions& o, Device device, metrics::MetricsWriter& out) {
  if (device == Device::cpu) {
    // One core's memcpy of the largest size, on rank 0 while the others wait: the rate a CPU
    // collective's busbw is measured against (NOTES.md). Bytes copied per second, as algbw counts them.
    c.barrier();
    if (c.rank() != 0) {
      c.barrier();
      return;
    }
    std::vector<unsigned char> source(o.max_bytes, 1), target(o.max_bytes, 2);
    double best = 0;
    for (int i = 0; i < o.warmup + o.iters; ++i) {
      auto begin = Clock::now();
      std::memcpy(target.data(), source.data(), o.max_bytes);
      const double seconds = std::chrono::duration<double>(Clock::now() - begin).count();
      if (i >= o.warmup && seconds > 0) best = std::max(best, static_cast<double>(o.max_bytes) / seconds / 1e9);
    }
    log("# memcpy of %zu bytes on one core: %.2f GB/s (the best of %d)\n", o.max_bytes, best, o.iters);
    out.write({{"event", "memcpy_bandwidth"}, {"bytes", o.max_bytes}, {"gbps", best}});
    c.barrier();
    return;
  }
  Tensor source = Tensor::zeros({static_cast<std::int64_t>(o.max_bytes / 4)}, device);
  Tensor target = source.clone();
  metrics::Timer timer(device);
  for (int i = 0; i < o.warmup; ++i) target.copy_from(source);
  timer.start();
  for (int i = 0; i < o.iters; ++i) target.copy_from(source);
  double seconds = timer.stop_ms() / 1000.0 / o.iters;
  double gbps = seconds > 0 ? 2.0 * static_cast<double>(o.max_bytes) / seconds / 1e9 : 0.0;
  log("# device memory bandwidth (copy of %zu bytes, read + write): %.1f GB/s\n", o.max_bytes, gbps);
  out.write({{"event", "device_bandwidth"}, {"bytes", o.max_bytes}, {"gbps", gbps}});
}

long run_benchmarks(comm::Communicator& c, const BenchOptions& o, const AlphaBeta& model, Device device,
                    metrics::MetricsWriter& out) {
  const int n = c.size(), me = c.rank();
  long total_wrong = 0;
  std::string current_op;
  const std::unique_ptr<comm::Communicator> ordered = c.split(0, me);
  ordered->add_in_ring_order();
  for (Case& k : cases(c, *ordered, o.root)) {
    if (!o.ops.empty() && !o.ops.count(k.op)) continue;
    if (k.op != current_op) {
      current_op = k.op;
      log("\n# %s, %d ranks, %s backend, %s tensors%s\n", k.op.c_str(), n, c.backend_name().c_str(),
          device_name(device),
          k.op == "broadcast" || k.op == "reduce" ? (", root " + std::to_string(o.root)).c_str() : "");
      log("# %12s %12s  %-7s %11s %11s %11s %11s %7s\n", "size(B)", "count", "algo", "time(us)", "model(us)",
          "algbw(GB/s)", "busbw(GB/s)", "#wrong");
    }
    for (std::size_t bytes = o.min_bytes;; bytes *= o.factor) {
      const std::size_t count = bytes / 4, ranks = static_cast<std::size_t>(n);
      const std::size_t in_n = k.layout == Layout::gather    ? count / ranks
                               : k.layout == Layout::scatter ? count / ranks * ranks
                                                             : count;
      const std::size_t out_n = k.layout == Layout::gather    ? count / ranks * ranks
                                : k.layout == Layout::scatter ? count / ranks
                                                              : count;
      std::vector<float> in_host(in_n);
      for (std::size_t i = 0; i < in_n; ++i) in_host[i] = value(me, i);
      const Shape in_shape{static_cast<std::int64_t>(in_n)};
      Tensor input = Tensor::from_host(in_host, in_shape, device);
      Tensor output = k.layout == Layout::in_place ? input : Tensor::zeros({static_cast<std::int64_t>(out_n)}, device);
      double seconds = 0;
      for (int i = 0; i < o.warmup + o.iters; ++i) {
        c.barrier();
        auto begin = Clock::now();
        k.run(input, output);
        if (i >= o.warmup) seconds += std::chrono::duration<double>(Clock::now() - begin).count();
      }
      // Fresh inputs, one more run, and check every element against the closed form.
      input.copy_from(Tensor::from_host(in_host, in_shape));
      k.run(input, output);
      long wrong = 0;
      if (!k.root_only || me == o.root) {
        auto got = output.to_host();
        const std::size_t each = k.layout == Layout::gather ? in_n : out_n;
        for (std::size_t i = 0; i < got.size(); ++i) wrong += got[i] != expected(k, i, me, n, o.root, each);
      }
      wrong = static_cast<long>(comm::all_reduce_scalar(c, static_cast<float>(wrong), comm::ReduceOp::sum));
      total_wrong += wrong;
      const double time = max_over_ranks(c, seconds / o.iters);
      const double sized = static_cast<double>(std::max(in_n, out_n) * 4);
      const double algbw = time > 0 ? sized / time / 1e9 : 0.0, busbw = algbw * k.bus_factor;
      const double predicted = model.valid && k.model ? k.model(sized, model) : -1.0;
      char model_text[32] = "-";
      if (predicted >= 0) std::snprintf(model_text, sizeof model_text, "%.1f", predicted * 1e6);
      log("  %12zu %12zu  %-7s %11.1f %11s %11.3f %11.3f %7ld\n", static_cast<std::size_t>(sized),
          std::max(in_n, out_n), k.algorithm.c_str(), time * 1e6, model_text, algbw, busbw, wrong);
      out.write({{"event", "bench"},
                 {"op", k.op},
                 {"algorithm", k.algorithm},
                 {"bytes", sized},
                 {"count", std::max(in_n, out_n)},
                 {"time_us", time * 1e6},
                 {"model_us", predicted >= 0 ? predicted * 1e6 : -1.0},
                 {"algbw_gbps", algbw},
                 {"busbw_gbps", busbw},
                 {"wrong", wrong},
                 {"ranks", n},
                 {"backend", c.backend_name()},
                 {"device", device_name(device)}});
      if (bytes > o.max_bytes / o.factor) break;
    }
  }
  return total_wrong;
}

}  // namespace course::chapter03
