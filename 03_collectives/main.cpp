// Chapter 03: collective communication. First a demonstration of each primitive on tiny tensors,
// printing every rank's data before and after (rank r starts with r+1). Then a benchmark in the
// layout of nccl-tests: every hand-written algorithm (naive, binomial tree, ring) beside the
// library's own call, each result checked, with an alpha-beta model's prediction beside the time.
//
// The algorithms are the lesson. The demonstration runs the chapter's own (collectives.cpp, its exercises:
// tree_broadcast, ring_reduce_scatter, ring_all_gather, and ring_all_reduce, which is the second followed
// by the third); the benchmark runs the library's copy (common/comm/algorithms.cpp, tested in
// tests/comm_test.cpp; later chapters call the library's collectives, which these teach): naive_broadcast
// and naive_reduce (the root talks to every peer in turn), tree_broadcast and tree_reduce (a binomial
// tree: ceil(log2 n) rounds), and the ring, pipelined in segments.
#include <cstdlib>
#include <sstream>

#include <CLI/CLI.hpp>

#include "03_collectives/collectives.h"  // the chapter's collectives: its exercises
#include "benchmark.h"                // the nccl-tests style harness and the alpha-beta fit
#include "common/comm/agree.h"  // all_reduce_scalar
#include "common/cli/cli.h"           // common flags, validators, exit codes
#include "common/cli/limits.h"        // refuse what cannot fit in memory
#include "common/cli/session.h"       // device, world and metrics, set up once
#include "common/comm/algorithms.h"   // the hand-written collectives
#include "common/comm/environment.h"  // MPI start-up
#include "common/core/log.h"          // rank 0 prints

using namespace course;
namespace algo = comm::algorithms;

namespace {

struct Options {
  cli::CommonOptions common;
  cli::DistributedOptions distributed;
  std::string mode = "all";
  std::string min_bytes = "8", max_bytes = "4M";
  std::size_t factor = 8;
  int iters = 5, warmup = 2, root = 0;
  std::vector<std::string> ops;
};

// Every rank's tensor, printed by rank 0 in rank order (gathered first, so lines do not interleave).
void show(comm::Communicator& c, const char* when, const Tensor& t) {
  Tensor all = Tensor::zeros({t.numel() * c.size()}, t.device());
  c.all_gather(t, all);
  auto v = all.to_host();
  for (int r = 0; r < c.size(); ++r) {
    std::ostringstream line;
    for (std::int64_t i = 0; i < t.numel(); ++i)
      line << (i ? " " : "") << v[static_cast<std::size_t>(r * t.numel() + i)];
    log("    %-6s rank %d: [%s]\n", when, r, line.str().c_str());
  }
}

// Each demonstration runs a hand-written algorithm, prints before and after, and checks the result.
bool demonstrate(comm::Communicator& c, Device device) {
  const int n = c.size(), me = c.rank();
  const float total = static_cast<float>(n * (n + 1) / 2);
  bool ok = true;
  auto check = [&](const char* name, const Tensor& t, const std::vector<float>& expected) {
    const bool good = comm::all_reduce_scalar(c, t.to_host() == expected ? 0.0f : 1.0f, comm::ReduceOp::sum) == 0.0f;
    log("    %s: %s\n", name, good ? "correct" : "WRONG");
    ok = ok && good;
  };
  auto mine = [&](std::int64_t count) { return Tensor::full({count}, static_cast<float>(me + 1), device); };

  log("\n== broadcast (binomial tree, root 0): the root's data reaches everyone in ceil(log2 %d) rounds\n", n);
  Tensor t = mine(4);
  show(c, "before", t);
  chapter03::tree_broadcast(c, t, 0);
  show(c, "after", t);
  check("broadcast", t, std::vector<float>(4, 1.0f));

  log("\n== reduce (binomial tree, sum to root 0): only the root holds the total\n");
  t = mine(4);
  show(c, "before", t);
  algo::tree_reduce(c, t, 0);
  if (me == 0)
    log("    after  rank 0: [%g %g %g %g]\n", t.to_host()[0], t.to_host()[1], t.to_host()[2], t.to_host()[3]);
  Tensor root_total = t.clone();
  c.broadcast(root_total, 0);
  check("reduce", root_total, std::vector<float>(4, total));

  log("\n== all-reduce (ring: reduce-scatter, then all-gather): everyone holds the total\n");
  t = mine(4);
  show(c, "before", t);
  chapter03::ring_all_reduce(c, t);
  show(c, "after", t);
  check("all_reduce", t, std::vector<float>(4, total));

  log("\n== all-gather (ring): everyone holds everyone's piece\n");
  t = mine(2);
  Tensor gathered = Tensor::zeros({2 * n}, device);
  show(c, "before", t);
  chapter03::ring_all_gather(c, t, gathered);
  show(c, "after", gathered);
  std::vector<float> expected;
  for (int r = 0; r < n; ++r) expected.insert(expected.end(), {static_cast<float>(r + 1), static_cast<float>(r + 1)});
  check("all_gather", gathered, expected);

  log("\n== reduce-scatter (ring): everyone holds the total of one piece\n");
  t = mine(2 * n);
  Tensor piece = Tensor::zeros({2}, device);
  show(c, "before", t);
  chapter03::ring_reduce_scatter(c, t, piece);
  show(c, "after", piece);
  check("reduce_scatter", piece, std::vector<float>(2, total));

  log("\n== scatter and gather (library calls, root 0): pieces out, pieces back\n");
  std::vector<float> pieces;
  for (int r = 0; r < n; ++r) pieces.insert(pieces.end(), {10.0f * r, 10.0f * r + 1});
  Tensor source = Tensor::from_host(pieces, {2 * n}, device), received = Tensor::zeros({2}, device);
  c.scatter(source, received, 0);
  show(c, "after", received);
  check("scatter", received, {10.0f * me, 10.0f * me + 1});
  Tensor back = Tensor::zeros({2 * n}, device);
  c.gather(received, back, 0);
  c.broadcast(back, 0);
  check("gather", back, pieces);
  return ok;
}

}  // namespace

// ---------------------------------------------------------------------------------------------------
// Below: the flags, and the run: the demonstration above, then the benchmark (benchmark.cpp), every
// algorithm beside the library and the alpha-beta model.
int main(int argc, char** argv) {
  comm::Environment env(argc, argv);
  cli::Program program{"Chapter 03: collective communication, demonstrated and benchmarked (run under mpirun)"};
  CLI::App& app = program.app();
  Options o;
  cli::add_common_options(app, o.common);
  cli::add_distributed_options(app, o.distributed);
  app.add_option("--mode", o.mode, "demo, bench or all")
      ->check(CLI::IsMember({"demo", "bench", "all"}))
      ->capture_default_str();
  app.add_option("-b,--minbytes", o.min_bytes, "Smallest message (bytes; K, M, G suffixes)")->capture_default_str();
  app.add_option("-e,--maxbytes", o.max_bytes, "Largest message")->capture_default_str();
  app.add_option("-f,--stepfactor", o.factor, "Size multiplier between rows (at least 2)")
      ->check(CLI::Range(std::size_t{2}, std::size_t{1024}))
      ->capture_default_str();
  app.add_option("-n,--iters", o.iters, "Timed iterations per row")->check(cli::PositiveInteger)->capture_default_str();
  app.add_option("-w,--warmup", o.warmup, "Untimed iterations per row")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--root", o.root, "Root rank of broadcast and reduce")->capture_default_str();
  app.add_option("--ops", o.ops,
                 "Collectives to benchmark (default all): all_reduce broadcast reduce all_gather reduce_scatter")
      ->delimiter(',');
  return program.run(argc, argv, [&] {
    // One float per element; 4 GiB keeps every element count within one MPI call.
    chapter03::BenchOptions bench{cli::parse_bytes(o.min_bytes, "-b", 4, std::size_t{1} << 32),
                                  cli::parse_bytes(o.max_bytes, "-e", 4, std::size_t{1} << 32),
                                  o.factor,
                                  o.warmup,
                                  o.iters,
                                  o.root,
                                  {}};
    for (const auto& op : o.ops) {
      if (!chapter03::kBenchmarkOps.count(op))
        throw UsageError("--ops: unknown collective '" + op +
                         "' (expected all_reduce, broadcast, reduce, all_gather or reduce_scatter)");
      bench.ops.insert(op);
    }
    if (bench.min_bytes > bench.max_bytes) throw UsageError("-b: " + o.min_bytes + " is larger than -e " + o.max_bytes);
    cli::Session session = cli::start_session(o.common, o.distributed);
    comm::Communicator* world = &session.topology->world();
    const Device device = session.device;
    metrics::MetricsWriter& out = session.metrics;
    // The benchmark holds an input, an output and the algorithms' scratch of the largest size at once.
    cli::check_memory(3.0 * static_cast<double>(bench.max_bytes), "-e " + o.max_bytes, world->local_size());
    if (o.root < 0 || o.root >= world->size())
      throw UsageError("--root: " + std::to_string(o.root) + " is out of range for " + std::to_string(world->size()) +
                       " ranks");
    log("Chapter 03 on %d ranks (%d on this machine), %s tensors\n", world->size(), world->local_size(),
        device_name(device));

    bool demo_ok = true;
    long wrong = 0;
    if (o.mode != "bench") demo_ok = demonstrate(*world, device);
    if (o.mode != "demo") {
      log("\n");
      chapter03::report_device_bandwidth(*world, bench, device, out);
      auto model = chapter03::fit_alpha_beta(*world, bench, out);
      wrong = chapter03::run_benchmarks(*world, bench, model, device, out);
      log("\n# total #wrong: %ld\n", wrong);
    }
    bool passed = demo_ok && wrong == 0;
    out.write({{"event", "summary"},
               {"passed", passed},
               {"wrong", wrong},
               {"ranks", world->size()},
               {"backend", world->backend_name()}});
    log("%s\n", passed ? "PASSED" : "FAILED");
    return passed ? 0 : 1;
  });
}
