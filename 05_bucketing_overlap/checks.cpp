// Chapter 05's lock-step check and its bucket faults.
#include "05_bucketing_overlap/checks.h"

#include <bit>
#include <cstdint>

#include "common/faults/faults.h"
#include "common/parallel/distributed_sampler.h"  // --fault skewed-share
#include "common/verify/compare.h"
#include "common/verify/data_parallel_check.h"

namespace course::chapter05 {

std::unique_ptr<verify::StepCheck> make_check(const Options& o, const nn::TrainingTask& task, comm::Communicator& group,
                                              const parallel::DistributedSampler& sampler, std::int64_t local_batch,
                                              optim::Recipe& training, const nn::Module& model) {
  parallel::refuse_inert_skewed_share(o.faults.fault, group.size());
  // A 16-bit hook adds in 16 bits: the bound follows its unit roundoff (common/verify/compare.h).
  const verify::Rounding rounding = o.comm_hook == "fp16"   ? verify::kFloat16Rounding
                                    : o.comm_hook == "bf16" ? verify::kBfloat16Rounding
                                                            : verify::kFloat32Rounding;
  return std::make_unique<verify::DataParallelCheck>(
      verify::DataParallelCheck::Run{group, model, training, /*loss_is_local=*/true,
                                     // what the lesson's loop trains on: the sampler's batch for this rank
                                     [&sampler, local_batch](std::int64_t step) { return sampler.batch(step, local_batch); }},
      [&] { return task.make_model(o.common.seed); },
      rounding,
      [&sampler, local_batch](std::int64_t step) { return sampler.global_batch(step, local_batch); },
      verify::DataParallelCheck::as_the_recipe_computes(training, task));
}

parallel::CommHook with_fault(parallel::CommHook inner, std::function<Messages()> messages) {
  if (faults::armed("none")) return inner;
  // The messages of a step go out in order: their count since the step began is the message's index.
  struct Count {
    std::int64_t step = -1;
    std::size_t launched = 0;
  };
  return [inner, messages, count = std::make_shared<Count>()](comm::Communicator& group, Tensor& buffer) {
    if (count->step != faults::step()) count->step = faults::step(), count->launched = 0;
    const std::size_t b = count->launched++;
    const Messages layout = messages();
    if (faults::active("skip-bucket") && b == 0) return comm::completed_work();  // never all-reduced
    if (faults::active("launch-early") && b == 0) {
      // Launched before its last gradient was in: the all-reduce averages the rest, and that gradient
      // lands afterwards, this rank's own.
      const std::size_t late = layout.first_last_offset, n = static_cast<std::size_t>(buffer.numel()) - late;
      Tensor own = buffer.flat_view(late, n).clone();
      inner(group, buffer)->wait();
      buffer.flat_view(late, n).copy_from(own);
      return comm::completed_work();
    }
    if (faults::active("step-early") && b + 1 == layout.count) {
      // The optimizer steps before the last message's average lands: it reads this rank's own gradients.
      Tensor copy = buffer.clone();
      inner(group, copy)->wait();
      return comm::completed_work();
    }
    if (faults::active("truncating-hook")) {
      // The hook's division by the ranks, then a conversion to bf16 that drops the low 16 bits. Multiplied
      // back by the ranks (exact: 8 significant bits times a small integer fit in float32), the hook's own
      // division and its conversion to the nearest bf16 give those truncated values back.
      const auto ranks = static_cast<float>(group.size());
      std::vector<float> values = buffer.to_host();
      for (float& v : values) v = std::bit_cast<float>(std::bit_cast<std::uint32_t>(v / ranks) & 0xffff0000u) * ranks;
      buffer.copy_from(Tensor::from_host(values, buffer.shape(), buffer.device()));
    }
    return inner(group, buffer);
  };
}

}  // namespace course::chapter05
