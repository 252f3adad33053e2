// Chapter 08's 1F1B schedule, the exercise of the chapter (08.1): the order in which each stage runs its
// micro-batches' forwards and backwards, as data. The chapter plays it for --schedule 1f1b (pipeline.cpp,
// after checking it cannot deadlock); the library keeps its own (parallel::one_f_one_b_schedule, for the
// planner and the other schedules), which the graded tests hold this one against
// (tests/schedule_exercise_test.cpp).
#pragma once
#include <string>

#include "common/parallel/pipeline_schedule.h"

namespace course::chapter08 {

// PipeDream-Flush's 1F1B (Narayanan et al., ICML 2021) for `stages` stages and `micro_batches`
// micro-batches: schedule[s] is stage s's actions in order (PipeAction{PipeOp::forward, i} or backward).
parallel::PipelineSchedule one_f_one_b(int stages, int micro_batches);

// The schedule the chapter plays for --schedule `name`: 1F1B the chapter's own, the others the library's
// (parallel::make_schedule); checked first (parallel::simulate) so that a schedule that would deadlock or
// leave out a pass is refused, naming the stage, instead of leaving the ranks waiting.
parallel::PipelineSchedule schedule_for(const std::string& name, int stages, int micro_batches, int chunks);

}  // namespace course::chapter08
