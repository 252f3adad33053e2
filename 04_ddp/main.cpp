// Chapter 04: distributed data parallel. Every rank holds the whole model and trains on its own share of
// each global batch. The parameters are broadcast once; after every backward each gradient is
// all-reduced and divided by the number of ranks (data_parallel.h, twenty lines); every rank then takes
// the same optimizer step, so the replicas stay identical. Below the fence: the checks that this is so
// (the ranks bit-identical at the end; with --verify every step against one rank with the global batch,
// in lock-step) and what the run reports (timings, metrics, --drift, --save).
#include <vector>

#include "04_ddp/data_parallel.h"                // the lesson: broadcast once, all-reduce every gradient
#include "04_ddp/checks.h"                       // --verify's check and --fault: beside the lesson
#include "04_ddp/report.h"                       // timings, --drift, the report and the verdict
#include "04_ddp/options.h"                      // the chapter's flags
#include "common/checkpoint/parameters.h"        // --save and --init: parameters as safetensors
#include "common/cli/cli.h"                      // common flags, validators, exit codes
#include "common/cli/precision_options.h"        // --tf32
#include "common/cli/session.h"                  // device, topology and metrics, set up once
#include "common/comm/agree.h"                   // all_reduce_scalar: the global batch's loss
#include "common/comm/environment.h"             // MPI start-up
#include "common/nn/tasks.h"                     // the model, its data and its loss
#include "common/ops/autocast.h"                 // --precision bf16|fp16: the forward's matrix products in 16 bits
#include "common/ops/ops.h"                      // scale
#include "common/optim/recipe.h"                 // --optimizer: SGD, or AdamW with warm-up, cosine decay, clipping
#include "common/parallel/distributed_sampler.h" // each rank's share of the data

using namespace course;
using chapter04::Options;
using chapter04::Report;

namespace {

nn::TrainingTask make_task(const Options& o, int copies, int ranks_here, Device device);
std::int64_t steps_to_take(const Options& o, std::int64_t steps_per_epoch);

// Forward and backward on one rank's share, in `accum` micro-batches (chapter 02): each loss weighted by
// its micro-batch's part of the share, the gradients adding up in .grad. Returns the share's loss. With
// --precision bf16 or fp16 the forward runs under autocast, and in fp16 backward starts from the loss
// times the loss scale (the recipe's), so that small gradients do not flush to zero.
float forward_backward(nn::Module& model, const nn::TrainingTask& task, const std::vector<std::int64_t>& share, int accum,
                       const optim::Recipe& training) {
  const auto micro = static_cast<std::int64_t>((share.size() + static_cast<std::size_t>(accum) - 1) / static_cast<std::size_t>(accum));
  double loss_sum = 0;
  for (const auto& micro_batch : data::split_batches(share, micro)) {
    const float weight = static_cast<float>(micro_batch.size()) / static_cast<float>(share.size());
    Tensor loss;
    {
      Autocast autocast(training.precision());  // fp32: off
      loss = scale(task.loss(model, micro_batch), weight);
    }
    training.scale_loss(loss).backward();
    loss_sum += loss.item();
  }
  return static_cast<float>(loss_sum);
}

int train(const Options& o, cli::Session& session) {
  comm::Communicator& group = session.topology->dp_group();  // pure data parallelism: every rank
  const int ranks = group.size();
  const nn::TrainingTask task = make_task(o, o.verify ? 2 : 1, group.local_size(), session.device);
  const std::int64_t global_batch = cli::global_batch_for(o.training, ranks, o.accum, task.size);
  const std::int64_t local_batch = global_batch / ranks;
  parallel::DistributedSampler sampler(task.size, group, o.common.seed);  // rank r takes samples r, r+R, ...

  // 1. Each rank initialises with its own seed on purpose: the broadcast is what makes them identical.
  auto model = task.make_model(o.common.seed + static_cast<std::uint64_t>(group.rank()));
  chapter04::DataParallelNaive ddp(model, group, o.precision.reduce());  // --reduce-dtype: fp32 unless asked
  const std::int64_t total_steps = steps_to_take(o, sampler.steps_per_epoch(local_batch));
  optim::Recipe training(model->parameters(),
                         {.name = o.optimizer, .lr = o.training.lr, .total_steps = total_steps,
                          .precision = o.precision.dtype(), .loss_scale = o.precision.loss_scale},
                         &group);
  // --verify: one rank beside the run, in lock-step, its step the lesson's own (checks.h); and --fault.
  const auto check = verify::check_if(o.verify, [&] {
    return make_check(o, task, group, sampler, *model, local_batch, training,
                      [&](nn::Module& m, const std::vector<std::int64_t>& share) {
                        return forward_backward(m, task, share, o.accum, training);
                      });
  });
  const faults::Installation faulty = install_faults(o, ddp, training);
  Report report(o, session, task, sampler, *model, global_batch, total_steps, training);

  for (std::int64_t step = 0; step < total_steps; ++step) {
    report.begin_step(step);
    check->begin_step(step);
    // 2. Forward and backward on this rank's share only: the gradients are this share's.
    const float local_loss = forward_backward(ddp.module(), task, sampler.batch(step, local_batch), o.accum, training);
    // 3. The lesson: every gradient all-reduced and divided by the ranks, the whole batch's gradient.
    ddp.all_reduce_gradients();
    training.unscale_();  // fp16: divided by the loss scale again, overflow agreed by every rank (else nothing)
    const float loss = comm::all_reduce_scalar(group, local_loss, comm::ReduceOp::average);  // the global batch's
    check->check_gradient(step, loss);
    // 4. The same update from the same gradient on every rank: the replicas stay identical (in fp16 a
    //    step whose gradient overflowed is skipped by every rank).
    const Tensor norm = training.step(step);
    check->check_update(step, optim::norm_value(norm));
    if (!report.end_step(step, loss, ddp.stats().exposed_ms, check->take_ms())) break;  // diverged
  }
  return report.finish(ddp.parameters_identical(), *check);
}

// ---------------------------------------------------------------------------------------------------
// Below: what the run checks and reports, and its plumbing. The lesson is above.

nn::TrainingTask make_task(const Options& o, int copies, int ranks_here, Device device) {
  nn::TrainingTask task = cli::training_task(o.models, o.mlp, o.training.global_batch, copies, ranks_here, device, o.common.seed);
  if (!o.init.empty()) {  // every model the run makes (the reference's too) starts from the file
    task.make_model = [fresh = task.make_model, path = o.init](std::uint64_t seed) {
      auto model = fresh(seed);
      try {
        checkpoint::load_parameters(path, *model);
      } catch (const checkpoint::CheckpointError& e) {
        throw UsageError(std::string("--init: ") + e.what());
      }
      return model;
    };
    task.make_model(0);  // a file that does not fit fails now, on every rank alike
  }
  return task;
}

// --steps, or --epochs whole epochs; refuses more than kMaxSteps, and a --fault-from-step past the end.
std::int64_t steps_to_take(const Options& o, std::int64_t steps_per_epoch) {
  if (o.epochs > cli::kMaxSteps / steps_per_epoch)
    throw UsageError("--epochs: " + std::to_string(o.epochs) + " epochs of " + std::to_string(steps_per_epoch) +
                     " steps exceed " + std::to_string(cli::kMaxSteps) + " steps");
  const std::int64_t steps = o.epochs > 0 ? o.epochs * steps_per_epoch : o.training.steps;
  cli::arm_faults(o.faults, o.verify, steps);
  return steps;
}

}  // namespace

int main(int argc, char** argv) {
  comm::Environment env(argc, argv);
  cli::Program program{"Chapter 04: distributed data parallel training, checked against the single-rank run"};
  chapter04::Options o;
  chapter04::add_options(program.app(), o);
  return program.run(argc, argv, [&] {
    cli::Session session = cli::start_session(o.common, o.distributed);
    cli::apply_precision(o.precision, session.device);  // --tf32 on a GPU
    return train(o, session);
  });
}
