// Lesson 4: the 3D grid, each rank's part of it made; below the fence, --fault on the run's objects.
#include "08_tensor_pipeline/grid.h"

#include "08_tensor_pipeline/context_parallel.h"  // lesson 3: the CP group's attention
#include "08_tensor_pipeline/tensor_parallel.h"   // lessons 1-2: the split model
#include "common/faults/communicator.h"           // --fault skip-tp-all-reduce
#include "common/parallel/comm_hooks.h"           // --reduce-dtype
#include "common/parallel/replicas.h"             // --fault stray-replica
#include "common/parallel/tensor_parallel_gpt.h"  // --fault exact-gelu: the blocks

namespace course::chapter08 {

namespace {
comm::Communicator& tp_group(GridRun& run, parallel::Topology& topology);
void install_faults(const Options& o, GridRun& run, parallel::Topology& topology);
}  // namespace

GridRun make_grid_model(const Options& o, const ChapterTask& task, parallel::Topology& topology, Device device) {
  GridRun run;
  // Lesson 3: with --cp, attention through the context-parallel group (made first: the blocks call it).
  run.cp = make_context_parallel(o, task.is_gpt(), topology);
  // Lessons 1 and 2: this rank's stage of the layers (all of them when --pp is 1), each split across its
  // TP group; interleaved 1F1B gives a stage --virtual-stages chunks.
  run.model = make_split_model(o, task, topology.pp_group(), tp_group(run, topology),
                               o.schedule == "interleaved" ? o.virtual_stages : 1, run.cp.get(), device);
  run.stage = dynamic_cast<parallel::PipelineStageGPT*>(run.model.get());
  // Data parallelism on top: each rank with the ranks that hold the same part in the other replicas,
  // and with --cp the other context-parallel ranks (each holds the gradient of its tokens: averaged
  // together, as Megatron-LM's data-parallel group with context parallelism).
  if (topology.dp_cp_group().size() > 1) {
    parallel::ReducerOptions reduce;
    reduce.reduce_dtype = o.precision.reduce();  // --reduce-dtype
    // Interleaved stages: one DDP per chunk, since each backward pass reaches one chunk's parameters.
    std::vector<std::shared_ptr<nn::Module>> parts{run.model};
    if (run.stage && run.stage->chunks() > 1) parts = run.stage->chunk_modules();
    for (auto& part : parts)
      run.ddp.push_back(std::make_unique<parallel::DistributedDataParallel>(part, topology.dp_cp_group(), reduce));
  }
  install_faults(o, run, topology);  // --fault, on the run's own objects (below the fence)
  return run;
}

namespace {

// ---------------------------------------------------------------------------------------------------
// Below: --fault, installed on the run's own objects (common/faults/faults.h).

comm::Communicator& tp_group(GridRun& run, parallel::Topology& topology) {
  if (faults::armed("skip-tp-all-reduce"))  // the layers' TP group, wrapped
    run.faulty_tp = faults::skip_all_reduces(topology.tp_group().split(0, topology.tp_rank()), "skip-tp-all-reduce");
  return run.faulty_tp ? *run.faulty_tp : topology.tp_group();
}

// --fault stray-replica: the last of the replicas holding this rank's part (its data- and context-parallel
// group) moves its first weight one unit in the last place further, as a rank whose update went astray.
// --fault stray-moment without TP (`optimizer` given): its AdamW first moment of that weight instead.
void stray_last_replica(nn::Module& model, parallel::Topology& topology, const optim::Optimizer* optimizer = nullptr) {
  comm::Communicator& replicas = topology.dp_cp_group();
  if (replicas.rank() != replicas.size() - 1) return;
  if (optimizer) parallel::stray_state_by_one_rounding(*optimizer, model.parameters().front());
  else parallel::stray_by_one_rounding(model.parameters().front());
}

// --fault stray-tp-copy: the last TP rank moves its copy of the first parameter every TP rank holds whole
// one unit in the last place further, as a rank whose update of a replicated tensor went astray.
// --fault stray-moment with TP (`optimizer` given): its AdamW first moment of that tensor instead.
void stray_last_tp_copy(parallel::TensorParallelModule& model, parallel::Topology& topology,
                        const optim::Optimizer* optimizer = nullptr) {
  if (topology.tp_group().rank() != topology.tp_size() - 1) return;
  for (const auto& [name, parameter] : model.named_parameters())
    if (!model.is_split(name)) {
      if (optimizer) parallel::stray_state_by_one_rounding(*optimizer, parameter);
      else parallel::stray_by_one_rounding(parameter);
      return;
    }
}

}  // namespace

faults::Installation install_optimizer_faults(const GridRun& run, parallel::Topology& topology,
                                              const optim::Optimizer& optimizer) {
  faults::Installation installed;
  if (faults::armed("stray-moment"))  // after the update, before the check judges it
    installed.on_step_end([model = run.model, &topology, &optimizer] {
      if (topology.tp_size() > 1) stray_last_tp_copy(*model, topology, &optimizer);
      else stray_last_replica(*model, topology, &optimizer);
    });
  return installed;
}

namespace {

void install_faults(const Options& o, GridRun& run, parallel::Topology& topology) {
  // Its CP attention, its blocks, its fix-ups after backward. (The layer code's own faults, sp-gather-rows,
  // ring-drop-block and row-parallel-no-sum, act in the whole process: the 16-bit check's split reference
  // makes them too.)
  if (faults::armed("skip-cp-offset") && run.cp) run.faults_installed.place(run.cp.get());
  if (faults::armed("exact-gelu"))
    for (auto& [name, module] : run.model->named_modules())
      if (auto* block = dynamic_cast<parallel::TensorParallelBlock*>(module)) run.faults_installed.place(block);
  if (faults::armed("skip-sp-sum") || faults::armed("skip-tied-exchange") || faults::armed("sp-unsummed-bias"))
    run.faults_installed.place(run.model.get());
  if (faults::armed("stray-replica"))  // after the update, before the check judges it
    run.faults_installed.on_step_end([model = run.model, &topology] { stray_last_replica(*model, topology); });
  if (faults::armed("stray-tp-copy"))
    run.faults_installed.on_step_end([model = run.model, &topology] { stray_last_tp_copy(*model, topology); });
  // skip-dp-average: DDP's communication hook does nothing, each replica keeping its own share's gradient.
  if (faults::armed("skip-dp-average"))
    for (auto& ddp : run.ddp)
      ddp->register_comm_hook([average = parallel::average_hook(o.precision.reduce())](comm::Communicator& group, Tensor& g) {
        if (faults::active("skip-dp-average")) return comm::completed_work();
        return average(group, g);
      });
}

}  // namespace

}  // namespace course::chapter08
