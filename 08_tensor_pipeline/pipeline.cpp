// Lesson 2: pipeline parallelism, the chapter's side (the schedules and their player: common/parallel/pipeline*.cpp).
#include "08_tensor_pipeline/pipeline.h"

#include "08_tensor_pipeline/schedule.h"  // the schedule played: 1F1B the chapter's own (exercise 08.1)

namespace course::chapter08 {

parallel::PipelineStep run_stages(GridRun& run, const ChapterTask& task, parallel::Topology& topology,
                                  const std::vector<std::vector<std::int64_t>>& all_parts, const std::string& schedule,
                                  const optim::Recipe& training, Device device) {
  const auto parts = run_parts(all_parts);
  std::vector<Tensor> ids, targets;
  for (const auto& part : parts) {
    auto b = task.batch(part, device);
    ids.push_back(b.ids);
    targets.push_back(b.targets);
  }
  const int p = topology.pp_size();
  const parallel::PipelineLinks links{topology.pp_group(), topology.previous_stage(), topology.next_stage()};
  std::vector<parallel::DistributedDataParallel*> replicas;  // DDP of the stage, or of each chunk
  for (auto& ddp : run.ddp) replicas.push_back(ddp.get());
  return parallel::run_pipeline(*run.stage, links,
                                schedule_for(schedule, p, static_cast<int>(parts.size()), run.stage->chunks()),
                                ids, targets, data::AdditionTask::kIgnore, replicas, &training.mixed_precision());
}

}  // namespace course::chapter08
