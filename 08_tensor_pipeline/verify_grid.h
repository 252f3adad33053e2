// --verify: the unsharded model beside the grid, in lock-step (common/verify/lockstep.h). Every step the
// grid's parameters and gradients are put back together (common/verify/whole_model.h) and compared
// with the unsharded model's over the whole global batch, which the ranks compute piece by piece; the
// tolerance is the step's own noise floor, since tensor and pipeline parallelism reorder the sums.
// In 16 bits (--precision bf16|fp16, --reduce-dtype) that floor cannot tell rounding from a lost
// micro-batch (README), so a grid is checked by its parts instead, as chapter 04 checks DDP: each
// micro-batch's gradient through the stages is the reference's on that micro-batch, bit for bit, and
// only the sums over micro-batches and replicas differ, within their derived bound. Without tensor
// parallelism the unsharded GPT computes a micro-batch as the stages do; a split layer rounds otherwise
// (its partial products in 16 bits, a row layer's bias after the sum), as does context-parallel
// attention (the other ranks' key-value blocks in the ring's order), so with --tp or --cp (and for the
// MLP, whose layers are split at any --tp) the reference of the parts is the run's own split model, its
// TP x CP ranks on threads of each process (common/verify/model_parallel_reference.h). That reference
// repeats a bug of the split layers (--fault sp-gather-rows, ring-drop-block, row-parallel-no-sum make
// three), so the step is then also held to the whole model, which runs none of their code: in float32,
// within a few times its own distance from float32 in the run's precision, and the split layers run
// again in float32 within a small share of that distance (Lockstep::check_whole).
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "common/data/sampling.h"
#include "common/metrics/metrics.h"
#include "common/verify/local_group.h"
#include "common/verify/whole_model.h"
#include "common/verify/lockstep.h"
#include "common/verify/model_parallel_reference.h"
#include "common/verify/step_check.h"
#include "08_tensor_pipeline/grid.h"
#include "08_tensor_pipeline/task.h"
#include "08_tensor_pipeline/tensor_parallel.h"  // make_split_model, micro_batch_loss: the reference split as the run

namespace course::chapter08 {

class GridCheck final : public verify::StepCheck {
 public:
  // `training`: the run's recipe, whose autocast and loss scale the reference computes with.
  GridCheck(const Options& o, const ChapterTask& task, const GridRun& run, parallel::Topology& topology,
            optim::Recipe& training);

 protected:
  void on_begin_step(std::int64_t step) override;  // the grid's parameters: the predicted ones?
  // After the gradient fix-ups and the unscaling, before clipping; `loss`: the step's over the global batch.
  void on_check_gradient(std::int64_t step, float loss) override;
  void on_check_update(std::int64_t step, double norm) override;  // after the optimizer step (norm: clipping's)
  verify::LockstepSummary on_finish() override;

 private:
  // Every copy inspected, not only the one the whole model is gathered from: the DP and CP replicas'
  // parameters and optimizer state, and the TP ranks' copies of what they all hold whole and of its
  // state, as of the update before `step`.
  void check_copies(std::int64_t step);
  // The samples the replicas trained on in `step`, against its global batch (verify/data_order.h).
  void check_data_order(std::int64_t step, const std::vector<std::int64_t>& global_batch);
  const Options& o_;
  const ChapterTask& task_;
  const GridRun& run_;
  parallel::Topology& topology_;
  optim::Recipe& training_;  // check_gradient unscales its gradients (fp16), as its step() would
  data::SampleStream stream_;  // the reference's own copy of the sample order
  std::shared_ptr<nn::Module> reference_;
  std::unique_ptr<optim::Recipe> trainer_;  // the run's recipe
  std::unique_ptr<verify::WholeModelGather> gather_;
  std::unique_ptr<verify::Lockstep> lockstep_;
  bool by_parts_ = false;  // 16 bits: the micro-batches as parts
  verify::LocalGroup alone_{1};  // the one pipeline stage of the TP reference's parts
  std::unique_ptr<verify::ModelParallelReference> split_reference_;  // 16 bits, split layers: the run's TP x CP ranks
  faults::Installation optimizer_faults_;  // --fault stray-moment, on the run's optimizer
};

// The most TP ranks whose sums a reference in one process can repeat on NCCL: two values add alike in
// either order, and beyond, NCCL's ring adds in an order of its own choosing. Under --verify the MPI
// backend adds a tensor-parallel group's sums, float32 and 16-bit, in the ring's fixed order
// (Communicator::add_in_ring_order, which GridCheck turns on), which the in-process groups repeat at any size. Adding the float32
// ones in MPI's order instead, a correct 1000-step TP 4 run with sequence parallelism in bf16 failed at
// step 176: one float32 rounding of the vocabulary-parallel loss flips 16-bit roundings downstream.
constexpr int kMostNcclTensorParallelRanksIn16Bits = 2;

// Whether --verify checks this run by its parts (16 bits), and whether it can check it at all: float32
// anywhere; 16 bits on the MPI backend, and on NCCL at up to kMostNcclTensorParallelRanksIn16Bits TP
// ranks; never TF32. Whether the reference of the parts is the run's split model (16 bits with TP or
// CP, or the MLP).
bool checked_by_parts(const Options& o, const parallel::Topology& topology);
bool checked_on_split_layers(const Options& o, const parallel::Topology& topology, const ChapterTask& task);
bool verifiable(const Options& o, const parallel::Topology& topology);
// --verify on a run it cannot check is refused (UsageError naming the flag, and why).
void check_verifiable(const Options& o, const parallel::Topology& topology);

// Logs the verdict in one line and writes the verify metric; true when it passed. `by_parts`: the run was
// checked by its parts (checked_by_parts); `split`: against the run's split model (checked_on_split_layers)
// of `ranks` TP x CP ranks.
bool report_check(const verify::LockstepSummary& check, const ChapterTask& task, bool by_parts, bool split, int ranks,
                  metrics::MetricsWriter& metrics);

}  // namespace course::chapter08
