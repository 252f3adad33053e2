// Chapter 05's checks beside its lesson: --verify's lock-step check of every mode against one rank
// (chapter 04's check, with the bound of the 16-bit hooks where one is chosen), and --fault's buckets
// handled wrongly, as a bug in a reducer would handle them, for the check to catch.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>

#include "05_bucketing_overlap/options.h"
#include "05_bucketing_overlap/report.h"
#include "common/nn/tasks.h"
#include "common/optim/recipe.h"
#include "common/parallel/distributed_sampler.h"
#include "common/parallel/reducer.h"
#include "common/verify/step_check.h"

namespace course::chapter05 {

// --verify: data parallelism's lock-step check (common/verify/data_parallel_check.h), one rank's model
// and SGD beside the run, re-synced to it every step, as chapter 04 checks DDP, with the bound of a 16-bit
// hook's sums where one is chosen. The loss it is given is this rank's: the check averages it over the ranks.
std::unique_ptr<verify::StepCheck> make_check(const Options& o, const nn::TrainingTask& task, comm::Communicator& group,
                                              const parallel::DistributedSampler& sampler, std::int64_t local_batch,
                                              optim::Recipe& training, const nn::Module& model);

// Where the messages of a step lie: how many there are, and where the first one's last gradient
// begins in its buffer (launch-early keeps that gradient this rank's own).
struct Messages {
  std::size_t count = 0;
  std::size_t first_last_offset = 0;
};

// --comm-hook `inner`, and around it the run's --fault (common/faults/faults.h) where it is one of the
// buckets': `messages` says where the step's messages lie.
parallel::CommHook with_fault(parallel::CommHook inner, std::function<Messages()> messages);

}  // namespace course::chapter05
