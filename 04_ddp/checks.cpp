// Chapter 04's lock-step check against one rank, and its faults.
#include "04_ddp/checks.h"

#include <utility>

#include "common/core/errors.h"
#include "common/ops/kernel_faults.h"
#include "common/ops/ops.h"
#include "common/parallel/comm_hooks.h"
#include "common/parallel/distributed_sampler.h"  // --fault skewed-share
#include "common/parallel/replicas.h"
#include "common/verify/compare.h"

namespace course::chapter04 {

std::unique_ptr<verify::StepCheck> make_check(const Options& o, const nn::TrainingTask& task, comm::Communicator& group,
                                              const parallel::DistributedSampler& sampler, const nn::Module& model,
                                              std::int64_t local_batch,
                                              optim::Recipe& training, ShareStep share_step) {
  parallel::refuse_inert_skewed_share(o.faults.fault, group.size());
  return std::make_unique<verify::DataParallelCheck>(
      verify::DataParallelCheck::Run{group, model, training, false,
                                     // what the lesson's loop trains on: the sampler's batch for this rank
                                     [&sampler, local_batch](std::int64_t step) { return sampler.batch(step, local_batch); }}, [&] { return task.make_model(o.common.seed); },
      verify::rounding_of(o.precision.reduce()),  // --reduce-dtype bf16|fp16: the parts added in 16 bits
      [&sampler, local_batch](std::int64_t step) { return sampler.global_batch(step, local_batch); },
      [&training, share_step = std::move(share_step)](nn::Module& reference, const std::vector<std::int64_t>& share) {
        const float loss = share_step(reference, share);
        training.scaler().unscale_gradients(reference.parameters());  // fp16: as the run unscales
        return loss;
      });
}

faults::Installation install_faults(const Options& o, DataParallelNaive& ddp, const optim::Recipe& training) {
  if (faults::armed("stray-replica") && ddp.communicator().size() < 2)
    throw UsageError("--fault: stray-replica needs two or more ranks (a replica beside rank 0 to go astray)");
  if (faults::armed("average-twice") && ddp.communicator().size() < 2)  // divided by 1 twice: nothing
    throw UsageError("--fault: average-twice needs two or more ranks (at one, dividing by the world size twice "
                     "changes nothing)");
  refuse_inert_kernel_fault(o.faults.fault, o.models.model == "gpt", o.precision.dtype());
  if (faults::armed("stray-moment") && ddp.communicator().size() < 2)
    throw UsageError("--fault: stray-moment needs two or more ranks (a replica beside rank 0 to go astray)");
  if (faults::armed("stray-moment") && o.optimizer != "adamw")
    throw UsageError("--fault: stray-moment moves an AdamW moment, and --optimizer " + o.optimizer +
                     " keeps no state: add --optimizer adamw");
  if (faults::armed("adamw-decay") && o.optimizer != "adamw")
    throw UsageError("--fault: adamw-decay breaks AdamW, which --optimizer " + o.optimizer + " does not use: add --optimizer adamw");
  faults::Installation installed;
  if (faults::armed("average-twice") || faults::armed("skip-rank-share"))
    ddp.register_comm_hook([average = parallel::average_hook(o.precision.reduce())](comm::Communicator& group, Tensor& g) {
      if (faults::active("average-twice")) {
        average(group, g)->wait();
        g.copy_from(scale(g, 1.0f / static_cast<float>(group.size())));  // divided by the world size twice
        return comm::completed_work();
      }
      if (faults::active("skip-rank-share") && group.rank() == group.size() - 1) g.fill_(0.0f);  // never arrives
      return average(group, g);
    });
  if (faults::armed("stray-replica"))  // after the update, before the check judges it: this replica alone
    installed.on_step_end([&ddp] {
      comm::Communicator& group = ddp.communicator();
      if (group.rank() == group.size() - 1) parallel::stray_by_one_rounding(ddp.module().parameters().front());
    });
  if (faults::armed("stray-moment"))  // after the update: this replica's optimizer state alone
    installed.on_step_end([&ddp, &training] {
      comm::Communicator& group = ddp.communicator();
      if (group.rank() == group.size() - 1)
        parallel::stray_state_by_one_rounding(training.optimizer(), ddp.module().parameters().front());
    });
  return installed;
}

}  // namespace course::chapter04
