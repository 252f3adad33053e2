// The lock-step check of a training run. At every step:
//   1. The run's parameters at the start of the step must be the ones the reference predicted, bit for
//      bit: at the first step the parameters the reference starts from (its initialisation, or the
//      checkpoint resumed), later the run's own update repeated by the reference. An optimizer's update
//      is elementwise, so sharding the parameters across ranks changes none of its arithmetic. Rank 0's
//      are compared with the prediction, and every replica's with rank 0's (check_replicas).
//   2. From those parameters, the gradient the run is about to apply (averaged over the ranks, summed
//      over its parts, before clipping) must equal the reference's gradient of the whole global batch,
//      and its loss the reference's loss, within a tolerance (compare.h):
//        parts:     the run's gradient is scale x (part 0 + ... + part R-1), and the reference can
//                   compute every part exactly as the run did (DDP's shares, accumulation's
//                   micro-batches, ZeRO's reduce-scatter, a pipeline's micro-batches): within the
//                   float32 bound of those additions. Where a part's gradient is itself a sum of
//                   terms (a tied table's two uses, accumulation inside a part), which the run may add
//                   across parts in another order, the bound counts every term and their magnitudes
//                   (verify::ContributionMagnitudes), not only each part's total, which may cancel.
//                   Where the run adds its parts in 16 bits, their errors must also not lean one way
//                   over the whole gradient, as rounding to nearest never does (RoundingBias);
//        reordered: the run reorders the computation itself (tensor and pipeline parallelism): within
//                   kNoiseFloorFactor times the step's own noise floor, the reference's gradient against
//                   itself from every parameter nudged by one rounding, its samples reversed;
//        whole:     after the parts, where the reference computed them with the run's own split layers
//                   (16 bits with tensor or context parallelism, verify::ModelParallelReference), which
//                   would repeat a bug in those layers: the whole model, sharing none of their code, in
//                   float32, within kWholeModelFloorFactor times its own distance from float32 in the
//                   run's precision, and the split layers themselves in float32 within a share of that
//                   distance (check_whole).
//   3. The norm the run clipped by must be the norm of that gradient, within the rounding of its
//      partial sums. The reference then applies the run's gradient with the run's optimizer and the
//      run's clipping factor, which predicts the next step's parameters (1), and that update must be the
//      papers' formulas' (set_optimizer, reference_optimizer.h), bit for bit.
// The reference re-takes the run's parameters every step, so no chaotic drift between two runs enters
// any comparison, however long the run: a fault that begins at any step fails at that step, and the
// summary names it. The reference's work is spread over the ranks: each computes its parts (or its
// piece of the global batch) on its own copy of the whole model, and rank 0 adds them up, compares
// and predicts. Chapters 02 and 04-08.
//
//   Lockstep check(reference, update, group, max_norm);
//   every step:  check.begin_step(step, the run's parameters)
//                ... the run's forward, backward and gradient synchronisation ...
//                check.check_parts(...) [and check.check_whole(...)] or check.check_reordered(...)
//                ... the run clips (its norm) and steps ...
//                check.check_update(step, norm)
//   at the end:  check.finish(the run's final parameters)      the verdict, the same on every rank
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/comm/communicator.h"
#include "common/core/dtype.h"
#include "common/nn/module.h"
#include "common/optim/optimizer.h"
#include "common/verify/compare.h"
#include "common/verify/reference_optimizer.h"

namespace course::verify {

// Computes part `index` of the step into `model`'s gradients (zeroed beforehand), exactly as the run
// computes it, and returns that part's loss.
using PartFunction = std::function<float(nn::Module& model, std::size_t index)>;
// Computes this rank's piece of the step's global batch into `model`'s gradients (zeroed beforehand),
// its loss weighted by its share of the batch, with the piece's samples in order or `reversed` (the
// noise floor's pass, from parameters each nudged by one rounding); returns the weighted loss. The
// pieces of all the ranks make the global batch.
using PieceFunction = std::function<float(nn::Module& model, bool reversed)>;
// Computes this rank's piece of the step's global batch (as PieceFunction, the samples in order) into
// `model`'s gradients, in the run's 16-bit precision (`sixteen_bits`: under its autocast and its loss
// scale, undone) or in float32; returns the weighted loss.
using PrecisionPieceFunction = std::function<float(nn::Module& model, bool sixteen_bits)>;
// Steps the reference's optimizer from the gradients in the reference's parameters, as the run's
// optimizer steps at `step` (its rate schedule included, its clipping not).
using UpdateFunction = std::function<void(std::int64_t step)>;

struct LockstepSummary {
  bool passed = true;
  std::int64_t steps = 0;               // steps whose gradient was checked
  std::int64_t updates = 0;             // updates the reference repeated (checked bit for bit)
  std::int64_t first_failed_step = -1;  // -1: none
  std::string first_failure;            // what differed there (rank 0, which logs, has the text)
  double worst_gradient_diff = 0, worst_gradient_ratio = 0;  // ratio: difference / its tolerance
  double worst_loss_diff = 0, worst_loss_ratio = 0;
  double worst_floor = 0;  // reordered: the largest noise floor measured on a tensor (0 for parts)
  double worst_bias_ratio = 0;  // parts added in 16 bits: the largest RoundingBias::ratio() (compare.h)
  // check_whole: the largest distance of a tensor's gradient (and of the loss) from the whole float32
  // model's, over its tolerance (kWholeModelFloorFactor x the 16-bit floor); 0 where it did not run.
  double worst_whole_ratio = 0, worst_whole_loss_ratio = 0;
  // check_whole with the split layers in float32: their largest distance from the whole float32 model's
  // gradient, over its bound (kSplitFloat32FloorShare of the 16-bit floor); 0 where it did not run.
  double worst_split_ratio = 0;
  // check_emulated: the largest distance of the 16-bit parts' gradient of a tensor (and of their loss)
  // from the emulated ones', over its tolerance (kEmulatedFloorFactor floors; on the CPU 0, or infinite
  // where a bit differed); 0 where it did not run.
  double worst_emulated_ratio = 0;
  std::int64_t skipped_steps = 0;  // float16 steps whose gradient overflowed, skipped by run and reference alike
};

// Builds the reference's model with its memory counted as MemoryCategory::verification, apart from the
// run's own accounting and budget (core/memory.h); everything the Lockstep computes is counted so too.
std::shared_ptr<nn::Module> make_reference(const std::function<std::shared_ptr<nn::Module>()>& make);

class Lockstep {
 public:
  // `reference`: a whole model of the run's architecture, made on every rank of `group` (nullptr for one
  // process), holding the parameters the run starts from (its initialisation, or the checkpoint the run
  // resumes: the reference reads them from the file itself). `update`: the reference's optimizer (called
  // on rank 0 only). `max_norm`: the run's gradient clipping (0: none).
  Lockstep(std::shared_ptr<nn::Module> reference, UpdateFunction update, comm::Communicator* group, double max_norm = 0);

  // The optimizer that `update` steps (on rank 0): its update is also computed from the papers' formulas
  // (ReferenceOptimizer, which reads its hyperparameters and its state at the first update) and must be
  // that, bit for bit: the run's optimizer class, which `update` repeats, is judged too.
  void set_optimizer(const optim::Optimizer& optimizer) { optimizer_ = &optimizer; }

  // The format the run adds its parts in: float32 (the default), or a 16-bit format when a compression
  // hook sums the gradients in 16 bits. The bound of check_parts grows with its unit roundoff.
  void set_rounding(Rounding rounding) { rounding_ = rounding; }
  // The factor the run's parts carried when it added them (fp16's loss scale, undone after the sum; 1
  // by default). In 16 bits a sum of finite parts can overflow: a run whose gradient is not finite where
  // the reference's is passes (both skip the step) only if its parts, so scaled, reach the format's
  // largest value.
  void set_loss_scale(double scale) { loss_scale_ = scale; }

  // Step `step` begins: `run_parameters` are the run's whole parameters in the reference's order (read
  // on rank 0). They must be what the reference predicted; every rank's reference copy takes them.
  void begin_step(std::int64_t step, const std::vector<float>& run_parameters);

  // The run's gradient (whole, before clipping; read on rank 0) and loss are scale x the sum of `parts`
  // parts. Rank r computes the parts r, r + size, r + 2 size, ... Collective. A run in float16 whose
  // gradient is not finite skips its update (its loss scale overflowed, optim::GradScaler): the
  // reference, computing the same parts with the same scale, must overflow too (or its parts reach
  // the run's 16-bit format's largest value, set_loss_scale), and then predicts no update (check_update
  // repeats none).
  void check_parts(std::int64_t step, const std::vector<float>& run_gradient, float run_loss, std::size_t parts,
                   double scale, const PartFunction& part);

  // The run's gradient (whole, before clipping; read on rank 0) and loss, against the whole global
  // batch, each rank computing its piece twice: as it is, and for the noise floor from nudged
  // parameters with its samples reversed (compare.h). Collective.
  void check_reordered(std::int64_t step, const std::vector<float>& run_gradient, float run_loss,
                       const PieceFunction& piece);

  // After check_parts, the same step, where the reference computed the parts with the run's own split
  // layers: the run's gradient and loss against code it does not share, the whole model on the whole
  // global batch. Each rank computes its piece in float32 and in the run's precision; per tensor, the
  // run's distance from the float32 gradient (Euclidean) must be within kWholeModelFloorFactor times the
  // 16-bit floor, the whole model's own distance in 16 bits (the largest of its last kFloorHistory, each
  // taken as a share of that step's gradient of the tensor), with the sums' last rounding in
  // `reduce_dtype` (the run's --reduce-dtype) added to it (compare.h). The loss likewise, within
  // kWholeModelLossFloorFactor floors. With `split_in_float32` (part `index` of the `parts`
  // through the run's split layers, as check_parts' reference computes it, but in float32; rank r
  // computes r, r + size, ...), the split layers' own code is judged at float32's precision too: their
  // gradient times `scale`, added over the parts, within kSplitFloat32FloorShare of each tensor's 16-bit
  // floor from the whole model's in float32 (the run's loss is held above). A bug the split layers share on
  // every rank (the run's copies agree) then fails at its step even where the 16-bit floor is wide.
  // Collective.
  void check_whole(std::int64_t step, float run_loss, const PrecisionPieceFunction& piece, DType reduce_dtype,
                   std::size_t parts = 0, double scale = 1, const PartFunction& split_in_float32 = nullptr);

  // After check_parts, the same step, for a run in 16 bits: check_parts' reference computed the parts
  // with the run's own 16-bit kernels, which would repeat a bug in them (a GELU that rounds toward zero, a
  // loss's backward that reads the next row's target). Each rank computes its parts again, `part` under
  // EmulatedSixteenBits (ops/autocast.h: float32 kernels, the 16-bit roundings as casts, no 16-bit
  // kernel), and again with every value nudged by one float32 rounding before it is rounded to 16 bits
  // (the floor: how far a legitimate float32 difference before the roundings, another summation order,
  // moves the result). Per tensor, the 16-bit parts' distance from the emulated ones (Euclidean, over
  // every rank's parts) must be within kEmulatedFloorFactor times the floor (the largest of its last
  // kFloorHistory, pooled as noise_floor_tolerances pools), and the parts' loss likewise. On the CPU, whose
  // 16-bit kernels compute as the emulation does, the parts must be its bits (no floor is measured).
  // Collective.
  void check_emulated(std::int64_t step, std::size_t parts, double scale, const PartFunction& part);
  // For tests: check_emulated holds the parts to the floor, as on a GPU, on any device.
  void hold_emulation_to_its_floor() { emulation_to_floor_ = true; }
  // For a reference whose parts compute on a model stored in 16 bits (chapter 07): there the casts of
  // EmulatedSixteenBits cannot tell which float32 values stand for 16-bit ones, so check_emulated runs
  // `part` under EmulatedHalfKernels instead (kernels/kernels.h: the CPU kernels, each 16-bit one
  // replaced by widening, its float32 kernel and one rounding), and the parts must be its bits. CPU only.
  void emulate_half_kernels() { emulate_kernels_ = true; }

  // The run has clipped by `run_norm` (ignored without clipping) and stepped: the reference repeats the
  // update on the gradient just checked, which predicts the next step's parameters.
  void check_update(std::int64_t step, double run_norm = 0);

  // The run's final parameters against the last prediction, and the verdict, the same on every rank of
  // the group. Collective.
  LockstepSummary finish(const std::vector<float>& final_parameters);

  // Every replica inspected, not only rank 0: `mine`, this rank's own parameters (its whole model under
  // data parallelism, its part of a TP x PP grid), must be bit for bit those of the first rank of
  // `replicas`, the ranks that hold the same ones. A 64-bit digest of each rank's bits is gathered over
  // `replicas`, and the judge hears of any rank that differs, naming it and the update that made it so
  // (step - 1's, or at the start the initialisation). The Module overloads below do this over the whole
  // group; the grids call it with their data-parallel groups, before finish() for the last update.
  // `what` names the values in the verdict: "parameters", or "optimizer state" (optimizer_state below).
  // Collective over the group.
  void check_replicas(std::int64_t step, const std::vector<float>& mine, comm::Communicator& replicas,
                      const char* what = "parameters");
  // The step the run's parameters are now ready for: one after the last update the reference repeated
  // (on rank 0, which judges; finish() and check_replicas at the end of a run take it).
  std::int64_t next_step() const { return predicted_by_ + 1; }

  // The same, for a run whose model is whole on every rank (data parallelism): its parameters and
  // gradients are read from it, on rank 0, and every rank's parameters are its replicas' (check_replicas).
  void begin_step(std::int64_t step, const nn::Module& run);
  void check_parts(std::int64_t step, const nn::Module& run, float run_loss, std::size_t parts, double scale,
                   const PartFunction& part);
  LockstepSummary finish(const nn::Module& run);

  // A failure a check beside the comparisons found at `step` (on rank 0, which judges): the verdict's,
  // when it is the first.
  void record(std::int64_t step, const std::string& text);

 private:
  bool judges() const { return !group_ || group_->rank() == 0; }
  int ranks() const { return group_ ? group_->size() : 1; }
  // The run's parameters at the start of `step` against the prediction.
  void compare_parameters(std::int64_t step, const std::vector<float>& run_parameters);
  // Adds `values` over the group onto rank 0 (in place; nothing without a group).
  void reduce(std::vector<float>& values);
  // The reference's sums of this step onto rank 0, the step counted, and on rank 0 the run's gradient
  // kept for the update; true on the rank that judges.
  bool gather_step(std::vector<float>& all, const std::vector<float>& run_gradient);

  std::shared_ptr<nn::Module> reference_;
  UpdateFunction update_;
  const optim::Optimizer* optimizer_ = nullptr;
  std::unique_ptr<ReferenceOptimizer> formulas_;  // rank 0, from the first update on
  comm::Communicator* group_;
  double max_norm_;
  Rounding rounding_ = kFloat32Rounding;
  double loss_scale_ = 1.0;
  std::vector<float> run_gradient_;  // rank 0: the gradient of the step being checked
  std::vector<double> sum_, magnitude_;  // check_parts' buffers, kept from step to step
  double parts_loss_ = 0;                // check_parts: this rank's parts' loss, for check_emulated
  std::vector<float> all_;
  FloorHistory floors_;  // rank 0, reordered: each tensor's last floors, then the loss's
  FloorHistory whole_floors_;  // rank 0, check_whole: each tensor's last 16-bit floors, then the loss's
  FloorHistory emulated_floors_;  // rank 0, check_emulated: each tensor's last floors, then the loss's
  std::vector<float> predicted_;     // rank 0: the parameters the next step must start from
  std::int64_t predicted_by_ = -1;   // the step whose update predicted them; -1: the start
  LockstepSummary summary_;
  bool skipping_ = false;  // rank 0: this step's gradient overflowed in the run and the reference
  bool emulation_to_floor_ = false;  // check_emulated: the floor on the CPU too
  bool emulate_kernels_ = false;     // check_emulated: EmulatedHalfKernels, not EmulatedSixteenBits
};

// The state `optimizer` holds (momentum, Adam's moments), in its order, for check_replicas: a replica whose
// state drifted updates its parameters wrong only at the next step (and a moment that drifted by less than
// a rounding of the update maybe never visibly), so every replica's state is compared as its parameters
// are, every step. `keep`: the parameters whose state is taken (all, by default).
std::vector<float> optimizer_state(const optim::Optimizer& optimizer,
                                   const std::function<bool(const Tensor& parameter)>& keep = {});

}  // namespace course::verify
