// Chapter 06's lock-step check against one rank that restored the same checkpoint on its own.
#include "06_checkpoint_failover/verify_resume.h"

#include "common/core/memory.h"
#include "common/verify/compare.h"

namespace course::chapter06 {

ResumeCheck::ResumeCheck(const Options& o, const nn::TrainingTask& task, const data::SampleStream& stream,
                         const Trainer& trainer, comm::Communicator& group, std::int64_t global_batch)
    : DataParallelCheck(Run{group, *trainer.model, *trainer.recipe}, [&] { return task.make_model(o.common.seed); },
                        {recipe_of(o), o.training.lr, o.training.steps},
                        verify::rounding_of(o.precision.reduce()),  // --reduce-dtype bf16|fp16: the parts added in 16 bits
                        [&stream, global_batch](std::int64_t step) { return stream.take(step * global_batch, global_batch); },
                        as_the_recipe_computes(*trainer.recipe, task)) {}

void ResumeCheck::restore(const std::string& path, const checkpoint::Loaded& loaded) {
  MemoryCategoryOverride verification(MemoryCategory::verification);
  checkpoint::restore(path, loaded, reference(), reference_recipe().optimizer());
}

}  // namespace course::chapter06
