// Chapter 04's checks beside its lesson. --verify: data parallelism's lock-step check
// (common/verify/data_parallel_check.h), one rank beside the run with the run's recipe made again. Each
// step the averaged gradient must be the average of the ranks' shares recomputed on one rank by the
// lesson's own step, within the bound of the type they were added in (--reduce-dtype); the update must be
// the run's optimizer's from it, bit for bit. --fault: the wrong averages and the stray replica it
// catches, installed on the run's DDP (common/faults/faults.h).
#pragma once
#include <cstdint>
#include <memory>

#include "04_ddp/data_parallel.h"
#include "04_ddp/options.h"
#include "common/faults/faults.h"
#include "common/nn/module.h"
#include "common/nn/tasks.h"
#include "common/optim/recipe.h"
#include "common/parallel/distributed_sampler.h"
#include "common/verify/data_parallel_check.h"

namespace course::chapter04 {

// One rank's forward and backward on a share of the batch (the lesson's own), returning its loss.
using ShareStep = verify::DataParallelCheck::ShareStep;

// `training`: the run's recipe (its loss scale); `share_step`: how a rank computed its share. The check's
// gradient loss is the step's over the global batch.
std::unique_ptr<verify::StepCheck> make_check(const Options& o, const nn::TrainingTask& task, comm::Communicator& group,
                                              const parallel::DistributedSampler& sampler, const nn::Module& model,
                                              std::int64_t local_batch,
                                              optim::Recipe& training, ShareStep share_step);

// The run's --fault, on its DDP: a communication hook that averages wrongly (average-twice,
// skip-rank-share), or the last replica's update astray (stray-replica); adamw-decay is a slip of the
// optimizer class itself (optim::Adam). For as long as the returned installation lives.
faults::Installation install_faults(const Options& o, DataParallelNaive& ddp, const optim::Recipe& training);

}  // namespace course::chapter04
