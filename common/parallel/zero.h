// Sharded data parallelism: ZeRO (Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training
// Trillion Parameter Models", SC 2020), stages 0 to 2, with AdamW in float32.
//
// Every rank holds a whole model and computes on its share of the batch, as in DDP; what changes is
// who keeps which model state. With Ψ parameters and N ranks, per rank (float32: 4 bytes each for the
// parameters and the gradients, 8 for Adam's two moments):
//   stage 0  DDP                                  params 4Ψ  grads 4Ψ    Adam 8Ψ     16Ψ
//   stage 1  optimizer state sharded              params 4Ψ  grads 4Ψ    Adam 8Ψ/N   8Ψ + 8Ψ/N
//            (PyTorch's ZeroRedundancyOptimizer)
//   stage 2  gradients sharded too                params 4Ψ  grads 4Ψ/N  Adam 8Ψ/N   4Ψ + 12Ψ/N
//            (FSDP's SHARD_GRAD_OP)
// Stage 0 all-reduces the gradients and every rank updates every parameter. Stage 1 reduce-scatters
// them instead (each rank receives the average of its part only), updates its part of the parameters
// with its part of Adam's state, and all-gathers the parameters. Stage 2 reduce-scatters each unit of
// gradients during backward, as soon as the unit is complete (overlapped with the rest of backward),
// and keeps only its part: the whole gradients never exist at once. Both move the same bytes as DDP's
// all-reduce (a reduce-scatter plus an all-gather is how a ring all-reduce works).
//
// Parameters live in flat buffers (flat_parameter.h), padded so that any size shards at any world size.
// Gradient clipping works on the shards: each rank sums the squares of its part and the sums are
// all-reduced, which gives the same norm as stage 0's.
#pragma once
#include <cstdint>
#include <deque>
#include <vector>

#include "common/comm/communicator.h"
#include "common/nn/module.h"
#include "common/parallel/flat_parameter.h"

namespace course::parallel {

struct ZeroOptions {
  int stage = 1;  // 0, 1 or 2
  // AdamW, PyTorch's defaults; weight decay on tensors of two or more dimensions only (GPT-2's groups).
  float lr = 1e-3f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weight_decay = 0.0f;
  double max_grad_norm = 0;        // clip_grad_norm_ when positive
  double unit_cap_mb = 25;         // parameters per flat unit (DDP's bucket_cap_mb)
};

class ZeroOptimizer {
 public:
  // Lays the model's parameters out in flat buffers (the model's tensors become views into them),
  // broadcasts rank 0's values, and allocates this rank's state. Throws std::invalid_argument for a
  // stage outside 0..2.
  ZeroOptimizer(nn::Module& model, comm::Communicator& group, ZeroOptions options);
  ZeroOptimizer(const ZeroOptimizer&) = delete;
  ZeroOptimizer& operator=(const ZeroOptimizer&) = delete;

  // After backward on this rank's share (the loss a mean over it): average the gradients over the
  // group, clip, update, and leave every rank with the same new parameters. Returns the gradient norm
  // before clipping (0 when clipping is off).
  double step();
  void zero_grad();
  void set_lr(float lr) { options_.lr = lr; }
  long steps_taken() const { return steps_; }

  int stage() const { return options_.stage; }
  const FlatLayout& layout() const { return layout_; }
  std::int64_t bytes_sent_last_step() const { return bytes_last_step_; }

 private:
  void on_gradient_ready(std::size_t param);
  void reduce_unit_async(std::size_t unit);  // stage 2: the unit's gradients are complete
  void complete_unit(std::size_t unit);
  void complete_finished_units(bool all);
  void finish_reductions();
  double clip();
  void update();
  void gather_parameters();
  Tensor part_of(const Tensor& flat_unit_buffer, std::size_t unit) const;  // this rank's part of a unit

  comm::Communicator& group_;
  ZeroOptions options_;
  std::vector<Tensor> params_;
  FlatLayout layout_;
  Tensor flat_params_;            // [padded], the model's parameters are views into it
  Tensor flat_grads_;             // stages 0 and 1: [padded], the parameters' .grad are views into it
  Tensor grad_shard_;             // stages 1 and 2: [shard], this rank's part of every unit's average
  Tensor exp_avg_, exp_avg_sq_;   // [padded] at stage 0, [shard] above
  std::vector<float> weight_decay_;  // per parameter

  // Stage 2: each unit's gradients gather in a buffer made when its first gradient arrives and freed
  // once its reduce-scatter has completed.
  struct PendingUnit {
    Tensor buffer;                 // [unit padded], communication
    std::size_t missing = 0;       // gradients not yet arrived in this pass
    Tensor reduced;                // [unit part], the reduce-scatter's output
    comm::WorkHandle work;
  };
  std::vector<PendingUnit> pending_;
  std::deque<std::size_t> in_flight_;  // units whose reduce-scatter runs, oldest first
  static constexpr std::size_t kMaxUnitsInFlight = 2;
  long steps_ = 0;
  std::int64_t bytes_at_last_step_ = 0, bytes_last_step_ = 0;
};

}  // namespace course::parallel
