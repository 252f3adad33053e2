// Chapter 08's 1F1B schedule (its exercise 08.1), and the schedule the chapter plays.
#include "08_tensor_pipeline/schedule.h"

#include <algorithm>
#include <stdexcept>

#include "common/core/exercise.h"  // exercise::not_done: the participant's copy stops at an unwritten one

namespace course::chapter08 {

// EXERCISE 08.1: the 1F1B schedule, as data.
// For each stage s of p: first fill the pipeline with min(p - s - 1, m) forwards (micro-batches 0, 1,
// ...); then, while forwards remain, one forward then one backward (the oldest micro-batch not yet
// backwarded); then drain the remaining backwards in order. The last stage thus alternates from its
// first micro-batch, and stage s never holds more than p - s micro-batches' activations, where GPipe's
// all-forwards-then-all-backwards holds m. Hint: the backward of micro-batch i on stage s needs the one
// of stage s + 1, which needs its forward first. Graded by ex08.1 (and 08's --verify with --pp).
parallel::PipelineSchedule one_f_one_b(int stages, int micro_batches) {
  // BEGIN EXERCISE 08.1
  parallel::PipelineSchedule schedule(static_cast<std::size_t>(stages));
  for (int s = 0; s < stages; ++s) {
    auto& actions = schedule[static_cast<std::size_t>(s)];
    const int warmup = std::min(stages - s - 1, micro_batches);
    int forwards = 0, backwards = 0;
    while (forwards < warmup) actions.push_back({parallel::PipeOp::forward, forwards++});
    while (forwards < micro_batches) {  // steady state: one forward, one backward
      actions.push_back({parallel::PipeOp::forward, forwards++});
      actions.push_back({parallel::PipeOp::backward, backwards++});
    }
    while (backwards < micro_batches) actions.push_back({parallel::PipeOp::backward, backwards++});  // drain
  }
  return schedule;
  // END EXERCISE 08.1
}

parallel::PipelineSchedule schedule_for(const std::string& name, int stages, int micro_batches, int chunks) {
  if (name != "1f1b") return parallel::make_schedule(name, stages, micro_batches, chunks);
  parallel::PipelineSchedule schedule = one_f_one_b(stages, micro_batches);
  try {
    if (static_cast<int>(schedule.size()) != stages)
      throw std::logic_error(std::to_string(schedule.size()) + " stages' lists for " + std::to_string(stages) + " stages");
    parallel::simulate(schedule);  // every pass once, in an order that can finish
  } catch (const std::logic_error& e) {
    throw std::logic_error(std::string("chapter08::one_f_one_b (--schedule 1f1b) gives a schedule that cannot run: ") +
                           e.what());
  }
  return schedule;
}

}  // namespace course::chapter08
