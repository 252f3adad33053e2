// Chapter 06: checkpoints and failover. Data-parallel training (chapter 04's MLP or GPT, chapter 05's
// buckets) with Adam (AdamW with its schedule for the GPT), saving a checkpoint every --ckpt-every
// steps: the parameters, Adam's moments and where training stands (step, global sample position, world
// size). A job that dies resumes from the newest good checkpoint and, because everything that decides
// the next step was saved, continues to exactly the result it would have reached without the failure:
// bit for bit at the same world size. scripts/failover.py restarts the job after a failure, as
// torchrun --max-restarts does. The loop below reads: resume or start, train, save when due. Beside it:
// checkpoints.cpp loads and saves (and kills a rank when told, --fail-at-step); with --verify every step,
// from the one it starts or resumes at, is checked in lock-step against one rank that read the same
// checkpoint itself (checks.cpp); report.cpp the figures.
#include "06_checkpoint_failover/options.h"         // the chapter's flags
#include "06_checkpoint_failover/checkpoints.h"     // load and save_if_due: the checkpoints, one file each
#include "06_checkpoint_failover/checks.h"          // --verify and --fault
#include "06_checkpoint_failover/report.h"          // the figures and the verdict
#include "06_checkpoint_failover/trainer.h"         // chapter 04's DDP step and its optimizer
#include "common/checkpoint/training_state.h"       // TrainingState: where training stands
#include "common/cli/precision_options.h"        // --tf32
#include "common/cli/session.h"                     // device, topology and metrics, set up once
#include "common/comm/environment.h"                // MPI start-up
#include "common/core/log.h"                        // rank 0 prints
#include "common/data/sampling.h"                   // SampleStream: a data order that survives a change of world size

using namespace course;
using namespace course::chapter06;

namespace {

int run(Options& o, cli::Session& session) {
  comm::Communicator& group = session.topology->dp_group();
  const nn::TrainingTask task = cli::training_task(o.models, o.mlp, o.training.global_batch, o.verify ? 2 : 1,
                                                   group.local_size(), session.device, o.common.seed);
  const std::int64_t global_batch = cli::global_batch_for(o.training, group.size(), 1, task.size);
  cli::check_kill_options(o.kill, o.training.steps, o.checkpoints.every, group.size(), /*only_rank0_writes=*/true);
  // The sample order is a function of the global position alone (seed, epoch): any world size can
  // continue it from a checkpoint's position.
  data::SampleStream stream(task.size, o.common.seed);
  Trainer trainer(o, task, group);
  // --verify: one rank beside the run, restored from the checkpoint the run resumes on its own (checks.h).
  const auto check = verify::check_if(o.verify, [&] {
    return std::make_unique<ResumeCheck>(o, task, stream, trainer, group, global_batch);
  });
  Report report(o, session, task, stream, trainer, global_batch);
  // Where training stands, saved beside the parameters and Adam's moments: step, sample position, epoch.
  checkpoint::TrainingState state;
  Checkpoints checkpoints(o, group, task, trainer, global_batch, state, *check, report, session.metrics);
  log("checkpoint failover: %d ranks, %s, %s lr %g, %lld steps of %lld samples; checkpoint every %lld "
      "steps into %s (keeping %d)%s\n",
      group.size(), task.description.c_str(), trainer.optimizer().name().c_str(), o.training.lr,
      static_cast<long long>(o.training.steps), static_cast<long long>(global_batch),
      static_cast<long long>(o.checkpoints.every), o.checkpoints.dir.c_str(), o.checkpoints.keep,
      cli::KillOptions::restart_count() ? (", restart " + std::to_string(cli::KillOptions::restart_count())).c_str() : "");

  // 1. Resume or start: with --resume, the newest good checkpoint (a damaged or foreign one is named
  //    and skipped) restores the parameters, the optimizer's moments and `state`, the place in the data.
  const std::int64_t first = checkpoints.load();
  const faults::Installation faulty = install_faults(o, trainer, state, first, global_batch, group.size());

  for (std::int64_t step = first; step < o.training.steps; ++step) {
    // 2. Train: one data-parallel step on the global batch at the saved position, then move on.
    report.begin_step();
    check->begin_step(step);
    const float loss = trainer.forward_backward(task, stream, state.samples_seen, global_batch, group);
    check->check_gradient(step, loss);
    const double norm = trainer.update(step);
    check->check_update(step, norm);
    state.samples_seen += global_batch;
    state.step = step + 1;
    state.epoch = stream.epoch_of(state.samples_seen);
    if (!report.end_step(step, loss, check->take_ms())) break;  // diverged: the newest checkpoint stays the last good one
    // 3. Save when due (and at the end): rank 0 writes, atomically, and keeps the newest --keep.
    checkpoints.save_if_due(state.step);
  }
  return report.finish(state, *check);
}

}  // namespace

// ---------------------------------------------------------------------------------------------------
// Below: the flags (options.cpp). What checks and reports the run is in report.cpp.
int main(int argc, char** argv) {
  comm::Environment env(argc, argv);
  cli::Program program{"Chapter 06: checkpoints, exact resume, and surviving a dead rank"};
  Options o;
  add_options(program.app(), o);
  return program.run(argc, argv, [&] {
    check_options(program.app(), o);
    cli::Session session = cli::start_session(o.common, o.distributed);
    cli::apply_precision(o.precision, session.device);  // --tf32 on a GPU
    return run(o, session);
  });
}
