// Sharded data parallelism: ZeRO (Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training
// Trillion Parameter Models", SC 2020), stages 0 to 3, with AdamW in float32.
//
// Every rank holds a whole model and computes on its share of the batch, as in DDP; what changes is
// who keeps which model state. With Ψ parameters and N ranks, per rank (float32: 4 bytes each for the
// parameters and the gradients, 8 for Adam's two moments):
//   stage 0  DDP                                  params 4Ψ  grads 4Ψ    Adam 8Ψ     16Ψ
//   stage 1  optimizer state sharded              params 4Ψ  grads 4Ψ    Adam 8Ψ/N   8Ψ + 8Ψ/N
//            (PyTorch's ZeroRedundancyOptimizer)
//   stage 2  gradients sharded too                params 4Ψ  grads 4Ψ/N  Adam 8Ψ/N   4Ψ + 12Ψ/N
//            (FSDP's SHARD_GRAD_OP)
//   stage 3  parameters sharded too               params 4Ψ/N grads 4Ψ/N Adam 8Ψ/N   16Ψ/N
//            (FSDP's FULL_SHARD)
// Stage 0 is chapter 04's data parallelism (every gradient averaged by one all-reduce, here of the
// flat buffer, and every rank updating every parameter) with the optimizer inside ZeroOptimizer, so that
// one training loop runs every stage and --verify checks them alike. Stage 1 reduce-scatters
// them instead (each rank receives the average of its part only), updates its part of the parameters
// with its part of Adam's state, and all-gathers the parameters. Stage 2 reduce-scatters each unit of
// gradients during backward, as soon as the unit is complete (overlapped with the rest of backward),
// and keeps only its part: the whole gradients never exist at once. Both move the same bytes as DDP's
// all-reduce (a reduce-scatter plus an all-gather is how a ring all-reduce works). Stage 3 keeps only
// its part of the parameters too: each unit (a wrapped module: a transformer block, a layer) is
// all-gathered just before its forward and freed after it, gathered again when backward reaches it and
// freed once its gradients are out, so about one layer's parameters exist at a time; the leftover
// parameters (embeddings, the final norm) form the root unit, gathered for the whole step. That is a
// second all-gather per step: 1.5 times the bytes of stages 0-2. With prefetching, the next unit's
// all-gather runs while the current unit computes.
//
// The code follows the stages: zero.cpp (the core, stages 0 and 1), zero_gradients.cpp (stage 2),
// zero_parameters.cpp (stage 3's units), zero_state.cpp (the state gathered whole, and the shard a
// checkpoint saves).
//
// Parameters live in flat buffers (flat_parameter.h), padded so that any size shards at any world size.
// Gradient clipping works on the shards: each rank sums the squares of its part and the sums are
// all-reduced, which gives the same norm as stage 0's.
#pragma once
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/comm/communicator.h"
#include "common/nn/module.h"
#include "common/parallel/flat_parameter.h"

namespace course::parallel {

// FSDP's auto-wrap policy: whether a module becomes a unit of its own at stage 3 (a module inside a unit
// is part of that unit). The default wraps each transformer block (nn::Block) and each nn::Linear
// outside one.
using UnitPolicy = std::function<bool(const std::string& name, nn::Module& module)>;
bool default_unit_policy(const std::string& name, nn::Module& module);

struct ZeroOptions {
  int stage = 1;  // 0, 1, 2 or 3
  // AdamW, PyTorch's defaults; weight decay on tensors of two or more dimensions only (GPT-2's groups).
  float lr = 1e-3f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weight_decay = 0.0f;
  double max_grad_norm = 0;        // clip_grad_norm_ when positive
  // The units: by default one per wrapped module (unit_policy, default_unit_policy when empty), so
  // stage 2 reduces gradients layer by layer; at stages 0-2 a positive unit_cap_mb makes them by size
  // instead, as DDP's buckets.
  double unit_cap_mb = 0;
  UnitPolicy unit_policy;
  // Stage 3: start gathering the next unit while this one computes (the next in forward order during
  // forward, the previous during backward): FSDP's forward_prefetch and backward_prefetch=BACKWARD_PRE.
  // Two units' parameters are then held at once instead of one.
  bool prefetch = false;
};


class ZeroOptimizer {
 public:
  // Lays the model's parameters out in flat buffers (the model's tensors become views into them),
  // broadcasts rank 0's values, and allocates this rank's state. Throws std::invalid_argument for a
  // stage outside 0..3. At stage 3 the model's parameters hold no memory outside their unit's forward
  // and backward: read them with full_parameters(). The hooks it puts on the model refer to it, so it
  // must live as long as the model runs forward.
  ZeroOptimizer(nn::Module& model, comm::Communicator& group, ZeroOptions options);
  ZeroOptimizer(const ZeroOptimizer&) = delete;
  ZeroOptimizer& operator=(const ZeroOptimizer&) = delete;

  // After backward on this rank's share (the loss a mean over it): average the gradients over the
  // group, clip, update, and leave every rank with the same new parameters. Returns the gradient norm
  // before clipping (0 when clipping is off). The same as reduce_gradients() then apply().
  double step();
  // The step's two halves. reduce_gradients: the average over the group (stage 0 all-reduces, stages
  // 1-3 reduce-scatter, each rank keeping its part). apply: clip, update this rank's part with its part
  // of Adam's state, all-gather the parameters (stages 1 and 2); returns the norm before clipping.
  void reduce_gradients();
  double apply();
  // Between the two: the averaged gradient of every parameter in registration order, gathered from
  // the ranks' parts at stages 1-3 (collective), for the lock-step check.
  std::vector<float> full_gradients();
  // Adam's two moments of every parameter in registration order, gathered the same way (collective):
  // what a lock-step reference starts from after a resume.
  struct FullState {
    std::vector<float> exp_avg, exp_avg_sq;
  };
  FullState full_optimizer_state();
  void zero_grad();
  void set_lr(float lr) { options_.lr = lr; }
  long steps_taken() const { return steps_; }

  // Every parameter's values in registration order (parameters_to_host), gathered at stage 3: for
  // verification and for writing one ordinary checkpoint.
  std::vector<float> full_parameters();

  // This rank's part of the training state, for a sharded checkpoint: "param", "exp_avg" and
  // "exp_avg_sq", each [layout().shard()], rank r's part of every unit (stage 3 holds no more; stages 1
  // and 2 hold the whole parameters but save their part). At stage 0 nothing is sharded: rank 0's holds
  // the whole [padded] buffers and the other ranks' nothing.
  std::vector<std::pair<std::string, Tensor>> state_shard() const;
  // Restores what state_shard() returned on this rank, in a run of the same model, stage and world
  // size, and the step count: every rank then holds the saved parameters. Collective.
  void load_state_shard(const std::vector<std::pair<std::string, Tensor>>& state, long steps);

  int stage() const { return options_.stage; }
  const FlatLayout& layout() const { return layout_; }
  std::int64_t bytes_sent_last_step() const { return bytes_last_step_; }  // payload handed to collectives
  // What a ring algorithm sends per rank for the collectives of the last step (backward's included):
  // all-reduce 2(N-1)/N of the buffer, reduce-scatter (N-1)/N, all-gather (N-1) times the part. The
  // theory: 2Ψ elements at stages 0-2, 3Ψ at stage 3 (its parameters are gathered twice).
  std::int64_t ring_bytes_last_step() const { return ring_bytes_last_step_; }

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
  // Every parameter's values in registration order from a buffer laid out as the flat units: [padded]
  // at stage 0, this rank's [shard] above (all-gathered unit by unit; collective).
  std::vector<float> gather_flat(const Tensor& buffer);
  class Uncounted;  // while alive, what is sent counts in neither bytes_sent_last_step nor ring_bytes
  void shard_parameters(nn::Module& model);  // stage 3's construction
  void gather_unit(std::size_t unit);        // stage 3: the unit's parameters, gathered, before returning
  void start_gather(std::size_t unit);       // stage 3: materialise the unit and start its all-gather
  void prefetch(std::size_t unit);           // start_gather when prefetching is on and `unit` is wrapped
  void release_unit(std::size_t unit);
  void count_ring(comm::OpKind kind, std::size_t bytes);

  comm::Communicator& group_;
  ZeroOptions options_;
  std::vector<Tensor> params_;
  FlatLayout layout_;
  Tensor flat_params_;            // [padded], the model's parameters are views into it
  Tensor flat_grads_;             // stages 0 and 1: [padded], the parameters' .grad are views into it
  Tensor grad_shard_;             // stages 1 and 2: [shard], this rank's part of every unit's average
  Tensor exp_avg_, exp_avg_sq_;   // [padded] at stage 0, [shard] above
  Tensor param_shard_;            // stage 3: [shard], this rank's part of every unit's parameters
  std::vector<std::shared_ptr<Storage>> unit_storage_;  // stage 3: each unit's gathered parameters
  std::vector<comm::WorkHandle> gathering_;              // stage 3: each unit's all-gather in flight
  std::size_t root_unit_ = 0;     // stage 3: the parameters no wrapped module owns
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
  std::int64_t ring_bytes_ = 0, ring_bytes_last_step_ = 0;  // this step so far; the last step's
};

}  // namespace course::parallel
