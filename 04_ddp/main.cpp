// Chapter 04: distributed data parallel. Every rank holds the whole MLP and trains on its own share of
// each global batch; DDP broadcasts the initial weights and averages the gradients, so all ranks take
// the same step. The program checks that the ranks end bit-identical and, with --verify, that the
// result equals a single-rank run over the same global batches.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <thread>

#include "common/cli/cli.h"                      // common flags, validators, exit codes
#include "common/cli/log.h"                      // rank 0 prints
#include "common/comm/environment.h"             // MPI start-up and --backend
#include "common/data/house_prices.h"            // the wide house-price data
#include "common/metrics/metrics.h"              // JSON-lines metrics
#include "common/nn/layers.h"                    // make_mlp
#include "common/ops/ops.h"                      // mse_loss, scale
#include "common/optim/optimizer.h"              // SGD
#include "common/parallel/ddp.h"                 // DistributedDataParallel
#include "common/parallel/distributed_sampler.h" // each rank's share of the data

using namespace course;
using Clock = std::chrono::steady_clock;

namespace {

// DDP and the single-rank run add the same per-sample gradients in a different order (R partial
// GEMMs and an all-reduce against one GEMM): float32 rounding, ~1e-7 relative per step, carried
// through the SGD steps. 1e-5 on weights of order 0.1 bounds that for this chapter's runs.
constexpr float kEquivalenceTolerance = 1e-5f;

struct Options {
  cli::CommonOptions common;
  cli::DistributedOptions distributed;
  std::int64_t global_batch = 240;  // divisible by 1, 2, 3, 4, 5, 6 and 8 ranks
  int accum = 1;
  int steps = 60;
  int epochs = 0;
  float lr = 0.01f;
  std::int64_t samples = 8192;
  std::int64_t features = 16;
  std::int64_t hidden = 256;
  int layers = 2;
  int log_every = 10;
  bool verify = false;
};

// The positions of step `s` (counted within its epoch) in the epoch's global order: rank r's local
// positions [p, p+b) are global positions [p*R, (p+b)*R), interleaved across ranks.
struct StepRange {
  std::int64_t local_begin, local_end;
};
StepRange step_range(std::int64_t step_in_epoch, std::int64_t local_batch, std::int64_t per_rank) {
  std::int64_t begin = step_in_epoch * local_batch;
  return {begin, std::min(per_rank, begin + local_batch)};
}

// One optimizer step on this rank's share, in `accum` micro-batches; the first accum-1 skip the
// all-reduce (no_sync) and the last one synchronises the accumulated gradients.
float train_step(parallel::DistributedDataParallel& ddp, optim::SGD& sgd, const data::Dataset& dataset,
                 const std::vector<std::int64_t>& share, int accum, Device device) {
  const auto micro = static_cast<std::int64_t>((share.size() + static_cast<std::size_t>(accum) - 1) / static_cast<std::size_t>(accum));
  auto micro_batches = data::split_batches(share, micro);
  double loss_sum = 0;
  for (std::size_t i = 0; i < micro_batches.size(); ++i) {
    data::Batch batch = data::make_batch(dataset, micro_batches[i], device);
    // Each micro-batch's mean, weighted by its share of the step (chapter 02).
    float weight = static_cast<float>(micro_batches[i].size()) / static_cast<float>(share.size());
    Tensor loss = scale(mse_loss(ddp(batch.x), batch.y), weight);
    if (i + 1 < micro_batches.size()) {
      auto guard = ddp.no_sync();
      loss.backward();
    } else {
      loss.backward();  // the last micro-batch: gradients are averaged across ranks here
    }
    loss_sum += loss.item();
  }
  sgd.step();
  sgd.zero_grad();
  return static_cast<float>(loss_sum);
}

// The reference: one rank, the same initial weights (rank 0's), the same global batches, mean loss.
std::vector<float> single_rank_reference(const Options& o, const data::Dataset& dataset, int ranks, Device device,
                                         int total_steps) {
  auto model = nn::make_mlp(dataset.features, o.hidden, o.layers, 1, nn::Activation::relu, device, o.common.seed);
  optim::SGD sgd(model->parameters(), o.lr);
  parallel::DistributedSampler sampler(dataset.size, ranks, 0, o.common.seed);
  const std::int64_t local_batch = o.global_batch / ranks;
  const std::int64_t steps_per_epoch = (sampler.num_samples() + local_batch - 1) / local_batch;
  for (int step = 0; step < total_steps; ++step) {
    sampler.set_epoch(static_cast<std::uint64_t>(step / steps_per_epoch));
    auto order = sampler.global_order();
    StepRange r = step_range(step % steps_per_epoch, local_batch, sampler.num_samples());
    std::vector<std::int64_t> batch_indices(order.begin() + r.local_begin * ranks, order.begin() + r.local_end * ranks);
    data::Batch batch = data::make_batch(dataset, batch_indices, device);
    mse_loss((*model)(batch.x), batch.y).backward();
    sgd.step();
    sgd.zero_grad();
  }
  return model->parameters_to_host();
}

int run(const Options& o, const comm::Environment& env) {
  const int ranks = env.size();
  if (o.global_batch % (static_cast<std::int64_t>(ranks) * o.accum) != 0)
    throw UsageError("--global-batch: " + std::to_string(o.global_batch) + " is not divisible by ranks x --accum (" +
                     std::to_string(ranks) + " x " + std::to_string(o.accum) + ")");
  Device device = select_device(o.common.device, env.local_rank(), env.rank() == 0);
  cli::configure_cpu_threads(env.local_size());
  auto world = comm::make_world(env, o.distributed.backend, device, o.distributed.timeout);
  metrics::MetricsWriter out(env.rank() == 0 ? o.common.metrics : std::string());

  data::Dataset dataset = data::make_house_prices_wide(o.samples, o.features, o.common.seed);  // the same on every rank
  // Each rank initialises with its own seed on purpose: the broadcast in DDP's constructor is what
  // makes them start identical.
  auto model = nn::make_mlp(o.features, o.hidden, o.layers, 1, nn::Activation::relu, device,
                            o.common.seed + static_cast<std::uint64_t>(world->rank()));
  parallel::DistributedDataParallel ddp(model, *world);
  optim::SGD sgd(model->parameters(), o.lr);
  parallel::DistributedSampler sampler(dataset.size, ranks, world->rank(), o.common.seed);

  const std::int64_t local_batch = o.global_batch / ranks;
  const std::int64_t steps_per_epoch = (sampler.num_samples() + local_batch - 1) / local_batch;
  const int total_steps = o.epochs > 0 ? static_cast<int>(o.epochs * steps_per_epoch) : o.steps;
  log("DDP: %d ranks x %lld samples (global batch %lld, %d micro-batches each), MLP %lld params, %d steps, lr %g\n",
      ranks, static_cast<long long>(local_batch), static_cast<long long>(o.global_batch), o.accum,
      static_cast<long long>(model->parameter_count()), total_steps, o.lr);

  double total_ms = 0, compute_ms = 0, comm_ms = 0;
  std::int64_t timed_samples = 0;
  for (int step = 0; step < total_steps; ++step) {
    sampler.set_epoch(static_cast<std::uint64_t>(step / steps_per_epoch));
    auto mine = sampler.indices();
    StepRange r = step_range(step % steps_per_epoch, local_batch, sampler.num_samples());
    std::vector<std::int64_t> share(mine.begin() + r.local_begin, mine.begin() + r.local_end);

    ddp.take_communication_ms();
    auto begin = Clock::now();
    float local_loss = train_step(ddp, sgd, dataset, share, o.accum, device);
    double step_ms = std::chrono::duration<double, std::milli>(Clock::now() - begin).count();
    double step_comm = ddp.take_communication_ms();
    if (step > 0) {  // the first step warms up allocators and caches
      total_ms += step_ms;
      comm_ms += step_comm;
      compute_ms += step_ms - step_comm;
      timed_samples += static_cast<std::int64_t>(share.size()) * ranks;
    }
    if (step % o.log_every == 0 || step + 1 == total_steps) {
      Tensor loss = Tensor::from_host({local_loss}, {1});  // the global batch's loss: the ranks' mean
      world->all_reduce(loss, comm::ReduceOp::average);
      float global_loss = loss.item();
      log("step %4d  loss %.6f  %.2f ms (compute %.2f, communication %.2f)\n", step, global_loss, step_ms,
          step_ms - step_comm, step_comm);
      out.write({{"event", "step"}, {"step", step}, {"loss", global_loss}, {"step_ms", step_ms},
                 {"compute_ms", step_ms - step_comm}, {"comm_ms", step_comm}});
    }
  }
  const int timed_steps = std::max(1, total_steps - 1);
  const double samples_per_s = total_ms > 0 ? static_cast<double>(timed_samples) / (total_ms / 1000.0) : 0.0;
  log("throughput: %.0f samples/s; per step %.2f ms = compute %.2f + communication %.2f\n", samples_per_s,
      total_ms / timed_steps, compute_ms / timed_steps, comm_ms / timed_steps);

  const bool identical = ddp.parameters_identical();
  log("parameters identical on all %d ranks: %s\n", ranks, identical ? "yes" : "NO");
  bool verified = true;
  float max_diff = 0;
  if (o.verify) {
    float diff = 0;
    parallel::on_rank0(*world, [&] {
      auto reference = single_rank_reference(o, dataset, ranks, device, total_steps);
      auto mine = model->parameters_to_host();
      for (std::size_t i = 0; i < mine.size(); ++i) diff = std::max(diff, std::fabs(mine[i] - reference[i]));
    });
    Tensor verdict = Tensor::from_host({diff}, {1});
    world->broadcast(verdict, 0);
    max_diff = verdict.item();
    verified = max_diff <= kEquivalenceTolerance;
    log("single-rank run with the global batch: largest parameter difference %.3g (tolerance %.0e)\n", max_diff,
        kEquivalenceTolerance);
  }
  const bool passed = identical && verified;
  out.write({{"event", "ddp_summary"}, {"ranks", ranks}, {"global_batch", o.global_batch},
             {"per_rank_batch", local_batch}, {"accum", o.accum}, {"steps", total_steps},
             {"samples_per_s", samples_per_s}, {"step_ms", total_ms / timed_steps},
             {"compute_ms", compute_ms / timed_steps}, {"comm_ms", comm_ms / timed_steps},
             {"parameters", model->parameter_count()}, {"identical", identical}, {"verified", o.verify},
             {"max_diff", max_diff}, {"tolerance", kEquivalenceTolerance}, {"passed", passed},
             {"backend", world->backend_name()}, {"device", device_name(device)},
             {"local_size", world->local_size()}, {"cores", std::thread::hardware_concurrency()}});
  log("%s\n", passed ? "PASSED" : "FAILED");
  return passed ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  comm::Environment env(argc, argv);
  CLI::App app{"Chapter 04: distributed data parallel training, checked against the single-rank run"};
  Options o;
  cli::add_common_options(app, o.common);
  cli::add_distributed_options(app, o.distributed);
  app.add_option("--global-batch", o.global_batch, "Samples per optimizer step, over all ranks")
      ->check(cli::PositiveInteger)->capture_default_str();
  app.add_option("--accum", o.accum, "Micro-batches per step on each rank (gradient accumulation)")
      ->check(cli::PositiveInteger)->capture_default_str();
  auto* steps = app.add_option("--steps", o.steps, "Optimizer steps")->check(cli::PositiveInteger)->capture_default_str();
  app.add_option("--epochs", o.epochs, "Train whole epochs instead of --steps")->check(cli::PositiveInteger)->excludes(steps);
  app.add_option("--lr", o.lr, "SGD learning rate (scale it with the global batch, see README)")
      ->check(cli::PositiveFinite)->capture_default_str();
  app.add_option("--samples", o.samples, "Dataset size")->check(cli::PositiveInteger)->capture_default_str();
  app.add_option("--features", o.features, "Input features")->check(CLI::Range(2, 1 << 16))->capture_default_str();
  app.add_option("--hidden", o.hidden, "Hidden width")->check(cli::PositiveInteger)->capture_default_str();
  app.add_option("--layers", o.layers, "Hidden layers")->check(cli::PositiveInteger)->capture_default_str();
  app.add_option("--log-every", o.log_every, "Print the loss every N steps")->check(cli::PositiveInteger)->capture_default_str();
  app.add_flag("--verify", o.verify, "Also train on one rank with the global batch and compare the parameters");
  return cli::run(app, argc, argv, [&] { return run(o, env); });
}
