// Sharded data parallelism: ZeRO (Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training
// Trillion Parameter Models", SC 2020), stages 0 to 3, with AdamW in float32 (on float32 masters of
// 16-bit parameters in mixed precision, below).
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
//
// Mixed precision (Micikevicius et al. 2018, as the ZeRO paper counts it: K = 12): with a 16-bit
// `precision` the model's parameters and gradients are bfloat16 or float16 (2 + 2 bytes), reduced and
// gathered in 16 bits, and the optimizer keeps float32 master weights beside Adam's two moments (4 + 8
// bytes), sharded as the stage says:
//   stage 0  params 2Ψ    grads 2Ψ    masters and Adam 12Ψ     16Ψ
//   stage 1  params 2Ψ    grads 2Ψ    masters and Adam 12Ψ/N   4Ψ + 12Ψ/N
//   stage 2  params 2Ψ    grads 2Ψ/N  masters and Adam 12Ψ/N   2Ψ + 14Ψ/N
//   stage 3  params 2Ψ/N  grads 2Ψ/N  masters and Adam 12Ψ/N   16Ψ/N
// The update widens this rank's gradients to float32 (float16's loss scale undone, optim::GradScaler,
// a step with an inf or NaN anywhere skipped by every rank), clips, steps the masters with AdamW and
// rounds them into the 16-bit parameters, which are then all-gathered: half the bytes of float32.
//
// ZeRO-Offload (Ren et al., "ZeRO-Offload: Democratizing Billion-Scale Model Training", USENIX ATC
// 2021): the optimizer's state and its computation move to the host. Each rank keeps its part of the
// float32 masters and Adam's moments in host memory (K = 12 bytes a parameter: with offloading a float32
// run keeps a float32 copy there too, since the device's parameters are what the model computes with),
// its part of the gradients goes down to the host as each unit's reduce-scatter completes during
// backward (stages 2 and 3; after backward at stages 0 and 1), AdamW steps on the host's CPU, and the
// updated part of the parameters goes up again before the all-gather. With `parameters` (stage 3 only,
// DeepSpeed's offload_param) this rank's part of the parameters stays on the host too and goes up each
// time its unit is gathered. Per rank, b bytes a parameter or gradient (2 in 16 bits, 4 in float32):
//   offload     device: params        grads              host
//   optimizer   as the stage          b Psi at 0-1, 0    12 Psi/N, 12 Psi at stage 0 (+ b Psi/N gradients at 2-3)
//   parameters  0 (units gathered)    0                  (12 + 2b) Psi/N, (12 + b) Psi/N in float32
// (In float32 the host's masters are the parameters' shard: one copy, not two.) A step moves b Psi/N
// down and b Psi/N up (b Psi each at stage 0), twice b Psi/N up with the parameters offloaded. The
// update is the same arithmetic on the same values, so the parameters are bit-identical to no
// offloading. Host memory is counted as MemoryCategory::offloaded, apart from the device's.
#pragma once
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/comm/communicator.h"
#include "common/core/dtype.h"
#include "common/nn/module.h"
#include "common/optim/grad_scaler.h"
#include "common/optim/mixed_precision.h"
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
  // The parameters' and gradients' type: float32, or bfloat16 / float16 over float32 masters (above).
  DType precision = DType::float32;
  float init_scale = 65536.0f;  // float16's initial loss scale (GradScaler's 2^16)
  // ZeRO-Offload (above): the optimizer's state and update on the host, and with `parameters` (stage 3)
  // this rank's part of the parameters too.
  enum class Offload { none, optimizer, parameters };
  Offload offload = Offload::none;
  // Which pieces of a unit's parameters a rank updates: given the unit's parameters' element counts in
  // their layout order, one rank's part (`part` elements) and the rank, the pieces of its part, each
  // FlatSegment's `param` the parameter's position in that order. Empty: FlatLayout::segments. Chapter 07
  // gives its own (exercise 07.1); each piece is checked to lie inside its parameter and the rank's part.
  std::function<std::vector<FlatSegment>(const std::vector<std::int64_t>& numels, std::int64_t part, int rank)>
      owned_segments;
};
const char* offload_name(ZeroOptions::Offload offload);  // "none", "optimizer", "parameters"


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

  // Forward and backward in the run's precision, as optim::Recipe::forward_backward: `forward` under
  // autocast (off in float32), backward from its loss times the loss scale. Returns the loss.
  Tensor forward_backward(const std::function<Tensor()>& forward) const;
  // The run's precision policy (optim/mixed_precision.h): the two halves apart, for a reference.
  const optim::MixedPrecision& mixed_precision() const { return mixed_; }
  // float16's loss scaler: its scale, and the steps it skipped because a gradient overflowed.
  const optim::GradScaler& scaler() const { return scaler_; }
  optim::GradScalerState scaler_state() const { return scaler_.state(); }
  void load_scaler_state(const optim::GradScalerState& state) { scaler_.load_state(state); }
  const ZeroOptions& options() const { return options_; }

  // After backward on this rank's share (the loss a mean over it): average the gradients over the
  // group, clip, update, and leave every rank with the same new parameters. Returns the gradient norm
  // before clipping (0 when clipping is off). The same as reduce_gradients() then apply().
  double step();
  // The step's two halves. reduce_gradients: the average over the group (stage 0 all-reduces, stages
  // 1-3 reduce-scatter, each rank keeping its part). apply: clip, update this rank's part with its part
  // of Adam's state, all-gather the parameters (stages 1 and 2); returns the norm before clipping
  // (infinity for a float16 step skipped because its gradients overflowed).
  void reduce_gradients();
  double apply();
  // Between the two: the averaged gradient of every parameter in registration order, gathered from
  // the ranks' parts at stages 1-3 (collective), for the lock-step check: widened to float32 and
  // unscaled as the update will use it.
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
  // verification and for writing one ordinary checkpoint. In mixed precision, the float32 masters (the
  // model's 16-bit parameters are their roundings).
  std::vector<float> full_parameters();

  // This rank's part of the training state, for a sharded checkpoint: "param" (the float32 masters in
  // mixed precision), "exp_avg" and
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
  // ZeRO-Offload: the bytes the last step copied from the device to the host (gradients) and back
  // (parameters); 0 without offloading.
  struct HostTraffic {
    std::int64_t down = 0, up = 0;
  };
  HostTraffic host_traffic_last_step() const { return host_last_step_; }
  ZeroOptions::Offload offload() const { return options_.offload; }

 private:
  void on_gradient_ready(std::size_t param);
  void reduce_unit_async(std::size_t unit);  // stage 2: the unit's gradients are complete
  void complete_unit(std::size_t unit);
  void complete_finished_units(bool all);
  void finish_reductions();
  bool mixed() const { return options_.precision != DType::float32; }
  bool offloaded() const { return options_.offload != ZeroOptions::Offload::none; }
  bool parameters_offloaded() const { return options_.offload == ZeroOptions::Offload::parameters; }
  bool has_master() const { return mixed() || offloaded(); }  // master_ holds the float32 values AdamW steps
  Device host_or(Device device) const { return offloaded() ? Device::cpu : device; }
  Tensor update_gradients();        // the held gradients in float32: themselves, or widened (mixed)
  double clip(const Tensor& grads);
  void update(const Tensor& grads);
  std::vector<FlatSegment> segments_owned(std::size_t unit, int rank) const;
  void round_parameters();          // mixed: the masters rounded into the 16-bit parameters this rank updates
  void gather_parameters();
  Tensor part_of(const Tensor& flat_unit_buffer, std::size_t unit) const;  // this rank's part of a unit
  // Between a [padded] buffer and a [shard] one: this rank's part of every unit, copied (converting
  // types where they differ) one way or the other.
  void copy_to_shard(const Tensor& padded, Tensor& shard) const;
  void copy_from_shard(const Tensor& shard, Tensor& padded) const;
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
  // Of the parameters' type (precision), as the gradients below:
  Tensor flat_params_;            // [padded], the model's parameters are views into it
  Tensor flat_grads_;             // stages 0 and 1: [padded], the parameters' .grad are views into it
  Tensor grad_shard_;             // stages 1-3: [shard], this rank's part of every unit's average (on the host
                                  // at stages 2-3 when offloaded)
  Tensor exp_avg_, exp_avg_sq_;   // [padded] at stage 0, [shard] above
  Tensor param_shard_;            // stage 3: [shard], this rank's part of every unit's parameters (on the host
                                  // with the parameters offloaded; in float32 then master_ itself)
  Tensor master_;                 // mixed or offloaded: float32 masters, [padded] at stage 0, [shard] above
  std::vector<Tensor> staged_;    // stage 3, parameters offloaded: each unit's part on the device while gathered
  optim::GradScaler scaler_;      // float16's loss scale (disabled otherwise)
  optim::MixedPrecision mixed_{options_.precision, scaler_};
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
  HostTraffic host_, host_last_step_;                       // ZeRO-Offload's copies: this step so far; the last step's
};

}  // namespace course::parallel
