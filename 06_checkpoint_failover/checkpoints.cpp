// Chapter 06's checkpoints, loaded and saved for the run, and --fail-at-step's kills.
#include "06_checkpoint_failover/checkpoints.h"

#include "06_checkpoint_failover/atomic_write.h"  // write_file: the chapter's atomic write (exercise 06.1)
#include "06_checkpoint_failover/checks.h"        // restores_into: --verify's reference restores on its own

namespace course::chapter06 {

Checkpoints::Checkpoints(const Options& o, comm::Communicator& group, const nn::TrainingTask& task, Trainer& trainer,
                         std::int64_t global_batch, checkpoint::TrainingState& state, verify::StepCheck& check,
                         Report& report, metrics::MetricsWriter& metrics)
    : o_(o), group_(group), trainer_(trainer), state_(state), check_(check), report_(report), metrics_(metrics),
      folder_(o.checkpoints.dir, o.checkpoints.keep), identity_(run_identity(o, task, *trainer.model, global_batch)) {
  folder_.set_writer(write_file);  // every file of the folder written by the chapter's own atomic write (06.1)
}

std::int64_t Checkpoints::load() {
  const checkpoint::Start start = checkpoint::resume_training(group_, folder_, o_.checkpoints.resume, identity_,
                                                              *trainer_.model, *trainer_.recipe, metrics_,
                                                              restores_into(check_));
  state_ = start.state;
  report_.begin(start);
  o_.kill.at_step_start(state_.step, group_.rank());  // a node lost, when asked (--fail-at-step)
  return state_.step;
}

void Checkpoints::save_if_due(std::int64_t steps_done) {
  if (checkpoint::writes_checkpoint_at(steps_done, o_.training.steps, o_.checkpoints.every))
    report_.saved(checkpoint::save_training(group_, folder_, state_, identity_.config, *trainer_.model,
                                            *trainer_.recipe, metrics_, o_.kill.during_save_of(steps_done, group_.rank())));
  if (steps_done < o_.training.steps) o_.kill.at_step_start(steps_done, group_.rank());  // the next step's start
}

}  // namespace course::chapter06
