// The unsharded reference of --verify, and the comparison step by step.
#include "verify_grid.h"

#include <algorithm>
#include <cstdio>
#include <set>

#include "common/core/log.h"
#include "common/ops/autocast.h"  // EmulatedSixteenBits
#include "common/ops/ops.h"
#include "common/verify/data_order.h"

namespace course::chapter08 {

GridCheck::GridCheck(const Options& o, const ChapterTask& task, const GridRun& run, parallel::Topology& topology,
                     optim::Recipe& training)
    : o_(o), task_(task), run_(run), topology_(topology), training_(training), stream_(task.task.size, o.common.seed) {
  // The tensor-parallel group's sums are inside each micro-batch's computation, so a reference that
  // repeats a 16-bit micro-batch in one process (verify/model_parallel_reference.h) must add its float32
  // ones in the same order too: a mode of the check, made before the first step on every rank alike; an
  // unchecked run adds as its backend likes.
  if (topology.tp_size() > 1) topology.tp_group().add_in_ring_order();
  reference_ = verify::make_reference([&] { return task.task.make_model(o.common.seed); });
  trainer_ = std::make_unique<optim::Recipe>(reference_->parameters(), training.options());
  // One copy of every element: the first replica's, the TP rank's that holds it (TP rank 0 for what
  // every TP rank holds whole), the first stage's tied table.
  gather_ = std::make_unique<verify::WholeModelGather>(*run.model, *reference_, topology.world(),
                                                         [&](const std::string& name) {
                                                           return topology.dp_rank() == 0 && topology.cp_rank() == 0 &&
                                                                  run.model->counts_once(name);
                                                         });
  lockstep_ = std::make_unique<verify::Lockstep>(reference_, [this](std::int64_t step) { trainer_->update(step); },
                                                 &topology.world(), o.clip);
  lockstep_->set_optimizer(trainer_->optimizer());  // and AdamW's formula itself
  optimizer_faults_ = install_optimizer_faults(run, topology, training.optimizer());
  by_parts_ = checked_by_parts(o, topology);
  // The run adds its micro-batches in float32, its replicas in the reduce type: the bound follows it.
  if (by_parts_) lockstep_->set_rounding(verify::rounding_of(o.precision.reduce()));
  if (checked_on_split_layers(o, topology, task)) {
    const Device device = reference_->parameters().front().device();
    split_reference_ = std::make_unique<verify::ModelParallelReference>(
        topology.tp_size(), topology.cp_size(), parallel::parse_context_method(o.cp_method),
        [&](comm::Communicator& tp, const parallel::ContextParallel* cp) {
          return make_split_model(o, task, alone_.member(0), tp, 1, cp, device);
        },
        *reference_, o.sequence_parallel);
  }
}

bool checked_by_parts(const Options& o, const parallel::Topology& topology) {
  const bool nccl = topology.backend_name().rfind("nccl", 0) == 0;
  return (o.precision.dtype() != DType::float32 || o.precision.reduce() != DType::float32) &&
         (!nccl || topology.tp_size() <= kMostNcclTensorParallelRanksIn16Bits);
}

bool checked_on_split_layers(const Options& o, const parallel::Topology& topology, const ChapterTask& task) {
  return checked_by_parts(o, topology) && (topology.tp_size() > 1 || topology.cp_size() > 1 || !task.is_gpt());
}

bool verifiable(const Options& o, const parallel::Topology& topology) {
  const bool float32 = o.precision.dtype() == DType::float32 && o.precision.reduce() == DType::float32;
  return !o.precision.tf32 && (float32 || checked_by_parts(o, topology));
}

void check_verifiable(const Options& o, const parallel::Topology& topology) {
  // The grid's lock-step check compares against the step's noise floor (verify_grid.h); in 16 bits that
  // floor is thousands of times float32's, and a lost micro-batch comes within a few floors of it, so
  // 16 bits are checked by their parts, against a reference that repeats the run's roundings.
  if (verifiable(o, topology)) return;
  const std::string sixteen = o.precision.dtype() != DType::float32 ? o.precision.precision : o.precision.reduce_dtype;
  throw UsageError(o.precision.tf32
                       ? "--verify: TF32 rounds every product's inputs to 10 bits, and a lost micro-batch comes within a "
                         "few noise floors of that; verify without --tf32"
                       : "--verify: checks " + sixteen + " on NCCL at up to " +
                             std::to_string(kMostNcclTensorParallelRanksIn16Bits) +
                             " TP ranks: more add in an order NCCL's ring chooses, which no reference repeats; use "
                             "--tp 2, --backend mpi, or --precision fp32 --reduce-dtype fp32");
}

namespace {
// The tensors every rank of the TP group holds whole, by identity: their optimizer state is every TP rank's too.
std::set<const void*> whole_tensors(const parallel::TensorParallelModule& model) {
  std::set<const void*> whole;
  for (const auto& [name, parameter] : model.named_parameters())
    if (!model.is_split(name)) whole.insert(parameter.impl());
  return whole;
}

// This rank's copies of what every rank of its TP group holds whole (layer norms, row-parallel biases), in
// order: the gather takes TP rank 0's, so every other TP rank's must be its bits.
std::vector<float> whole_on_every_tp_rank(const parallel::TensorParallelModule& model) {
  std::vector<float> values;
  for (const auto& [name, parameter] : model.named_parameters())
    if (!model.is_split(name)) {
      const auto host = parameter.to_host();
      values.insert(values.end(), host.begin(), host.end());
    }
  return values;
}
}  // namespace

// The whole vectors put together for the check count as its memory, not the run's.
void GridCheck::on_begin_step(std::int64_t step) {
  MemoryCategoryOverride verification(MemoryCategory::verification);
  lockstep_->begin_step(step, gather_->parameters());
  check_copies(step);
}

void GridCheck::check_copies(std::int64_t step) {
  // The whole model is gathered from one copy of each part; the other replicas (the DP and CP ranks of the
  // same TP and PP coordinates) must hold that copy's bits, and so must the other TP ranks' copies of
  // what they all hold whole.
  const optim::Optimizer& optimizer = training_.optimizer();
  lockstep_->check_replicas(step, run_.model->parameters_to_host(), topology_.dp_cp_group());
  lockstep_->check_replicas(step, verify::optimizer_state(optimizer), topology_.dp_cp_group(), "optimizer state");
  if (topology_.tp_size() > 1) {
    lockstep_->check_replicas(step, whole_on_every_tp_rank(*run_.model), topology_.tp_group());
    const auto whole = whole_tensors(*run_.model);
    lockstep_->check_replicas(step, verify::optimizer_state(optimizer, [&](const Tensor& p) { return whole.count(p.impl()) > 0; }),
                              topology_.tp_group(), "optimizer state");
  }
}

void GridCheck::check_data_order(std::int64_t step, const std::vector<std::int64_t>& global_batch) {
  // What this replica trained on (the loop's micro_batches, one after the other), gathered over the DP
  // group and held against the global batch alone: the 16-bit reference below cuts its parts with the
  // same micro_batches, so a bug the run and it share fails here. Every DP group holds the same shares;
  // world rank 0's group's verdict is the one recorded.
  std::vector<std::int64_t> mine;
  for (const auto& part : micro_batches(global_batch, topology_.dp_rank(), topology_.dp_size(), o_.micro_batches))
    mine.insert(mine.end(), part.begin(), part.end());
  const std::string wrong = verify::check_data_order(topology_.dp_group(), mine, global_batch);
  if (!wrong.empty()) lockstep_->record(step, "the data order: " + wrong);
}

void GridCheck::on_check_gradient(std::int64_t step, float loss) {
  training_.unscale_();  // fp16: the gradients the update will use (step() would unscale them next; once either way)
  const optim::Recipe& training = training_;
  MemoryCategoryOverride verification(MemoryCategory::verification);
  const auto global_batch = stream_.take(step * o_.training.global_batch, o_.training.global_batch);
  check_data_order(step, global_batch);
  // Rank r's piece of the global batch: its r-th contiguous slice, the loss weighted by its share.
  const auto ranks = static_cast<std::size_t>(topology_.size()), r = static_cast<std::size_t>(topology_.rank());
  const std::vector<std::int64_t> piece(global_batch.begin() + static_cast<long>(r * global_batch.size() / ranks),
                                        global_batch.begin() + static_cast<long>((r + 1) * global_batch.size() / ranks));
  const auto piece_loss = [&](nn::Module& model, bool reversed) {
    auto samples = piece;
    if (reversed) std::reverse(samples.begin(), samples.end());
    return scale(task_.task.loss(model, samples), static_cast<float>(samples.size()) / static_cast<float>(global_batch.size()));
  };
  if (by_parts_) {
    // Part (d M + i) CP + c: replica d's micro-batch i on context-parallel rank c (its tokens' share of
    // the loss, times CP), weighted as the run weights it within the replica; the replicas and the CP
    // ranks averaged (DDP over them). In the run's precision and loss scale (Recipe::reference_backward).
    const int dp = topology_.dp_size(), m = o_.micro_batches, cp = topology_.cp_size();
    lockstep_->set_loss_scale(training.scaler().get_scale());  // fp16: the parts the run added carried it
    // `float32`: the split reference's part without the run's precision (check_whole, below).
    const auto part_in = [&](nn::Module& model, std::size_t index, bool float32) {
      const int c = static_cast<int>(index) % cp, micro = static_cast<int>(index) / cp;
      const auto parts = micro_batches(global_batch, micro / m, dp, m);
      const auto i = static_cast<std::size_t>(micro % m);
      const Device device = model.parameters().front().device();
      const float weight = micro_batch_weights(task_, parts, device)[i];
      if (!split_reference_)
        return training.reference_backward(model.parameters(), [&] {
          return scale(task_.task.loss(model, parts[i]), weight);
        });
      // The run's TP x CP ranks, each its part of the micro-batch's forward and backward.
      const auto batch = task_.is_gpt() ? task_.batch(parts[i], device) : data::AdditionTask::Batch{};
      return split_reference_->backward(
          model,
          [&](parallel::TensorParallelModule& part) {
            const auto loss = [&] { return scale(micro_batch_loss(part, task_, parts[i], batch), weight); };
            if (!float32) return training.reference_backward(part.parameters(), loss);
            Tensor value = loss();
            value.backward();
            return value.item();
          },
          c);
    };
    const auto part = [&](nn::Module& model, std::size_t index) { return part_in(model, index, false); };
    const auto count = static_cast<std::size_t>(dp * m * cp);
    lockstep_->check_parts(step, gather_->gradients(), loss, count, 1.0 / (dp * cp), part);
    // The whole model's parts ran the run's own 16-bit kernels: held to the same parts without them.
    if (is_16bit(o_.precision.dtype())) lockstep_->check_emulated(step, count, 1.0 / (dp * cp), part);
    // The split reference repeats the run's layer code, bugs included: the whole model, which shares none
    // of it, judges that code, in float32 beside its own distance from float32 in the run's precision
    // (emulated: no 16-bit kernel, whose bug would move the floor with it), and the split layers again in
    // float32, held to the whole model at float32's precision.
    if (split_reference_)
      lockstep_->check_whole(step, loss, [&](nn::Module& model, bool sixteen_bits) {
        if (piece.empty()) return 0.0f;
        if (sixteen_bits) {
          EmulatedSixteenBits emulated;
          return training.reference_backward(model.parameters(), [&] { return piece_loss(model, false); });
        }
        Tensor value = piece_loss(model, false);
        value.backward();
        return value.item();
      }, o_.precision.reduce(), count, 1.0 / (dp * cp), [&](nn::Module& model, std::size_t index) {
        return part_in(model, index, true);
      });
    return;
  }
  lockstep_->check_reordered(step, gather_->gradients(), loss, [&](nn::Module& model, bool reversed) {
    if (piece.empty()) return 0.0f;
    // In the run's precision: under its autocast, backward from the loss times its loss scale, undone.
    return training.reference_backward(model.parameters(), [&] { return piece_loss(model, reversed); });
  });
}

void GridCheck::on_check_update(std::int64_t step, double norm) {
  lockstep_->check_update(step, norm);
}

verify::LockstepSummary GridCheck::on_finish() {
  MemoryCategoryOverride verification(MemoryCategory::verification);
  check_copies(lockstep_->next_step());
  return lockstep_->finish(gather_->parameters());
}

bool report_check(const verify::LockstepSummary& c, const ChapterTask& task, bool by_parts, bool split, int ranks,
                  metrics::MetricsWriter& metrics) {
  const char* model = task.is_gpt() ? "GPT" : "MLP";
  const std::string reference = split ? "the " + std::string(model) + " split as the run splits it (its " +
                                            std::to_string(ranks) + " model-parallel rank" + (ranks > 1 ? "s" : "") +
                                            " in each process)"
                                      : "the unsharded " + std::string(model);
  // The split layers judged by code they do not share (Lockstep::check_whole).
  char whole[320] = "";
  if (split)
    std::snprintf(whole, sizeof whole, "; against the whole %s in float32, every gradient within %g x the whole %s's own "
                  "distance in 16 bits (at most %.3g of that), the split layers in float32 within 1/%g of it (%.3g "
                  "of that)", model, verify::kWholeModelFloorFactor, model, c.worst_whole_ratio,
                  1 / verify::kSplitFloat32FloorShare, c.worst_split_ratio);
  if (c.passed && by_parts)
    log("verify, %lld steps in lock-step against %s, micro-batch by micro-batch: every gradient within the "
        "bound of its sums over micro-batches and replicas (at most %.3g of it), every loss (%.3g of its bound)%s; every "
        "update the unsharded AdamW's, bit for bit%s: PASSED\n",
        static_cast<long long>(c.steps), reference.c_str(), c.worst_gradient_ratio, c.worst_loss_ratio, whole,
        c.skipped_steps ? (" (" + std::to_string(c.skipped_steps) + " fp16 steps overflowed and were skipped by both)").c_str()
                        : "");
  else if (c.passed)
    log("verify, %lld steps in lock-step against the unsharded %s on the whole global batch: every gradient within "
        "%g x its step's noise floor (at most %.3g of that tolerance; the largest floor %.3g), every loss (%.3g of "
        "its tolerance), every update the unsharded AdamW's, bit for bit: PASSED\n",
        static_cast<long long>(c.steps), model, verify::kNoiseFloorFactor, c.worst_gradient_ratio, c.worst_floor,
        c.worst_loss_ratio);
  else
    log("verify against %s FAILED at step %lld: %s\n", reference.c_str(), static_cast<long long>(c.first_failed_step),
        c.first_failure.c_str());
  metrics.write({{"event", "verify"}, {"passed", c.passed}, {"by_parts", by_parts}, {"split_reference", split}, {"steps", c.steps}, {"first_failed_step", c.first_failed_step},
                 {"gradient_ratio", c.worst_gradient_ratio}, {"loss_ratio", c.worst_loss_ratio},
                 {"rounding_bias_ratio", c.worst_bias_ratio},
                 {"emulated_ratio", c.worst_emulated_ratio},
                 {"whole_ratio", c.worst_whole_ratio}, {"whole_loss_ratio", c.worst_whole_loss_ratio},
                 {"split_ratio", c.worst_split_ratio},
                 {"whole_floor_factor", split ? verify::kWholeModelFloorFactor : 0.0},
                 {"whole_loss_floor_factor", split ? verify::kWholeModelLossFloorFactor : 0.0},
                 {"gradient_diff", c.worst_gradient_diff}, {"noise_floor", c.worst_floor},
                 {"noise_floor_factor", by_parts ? 0.0 : verify::kNoiseFloorFactor},
                 {"loss_floor_factor", by_parts ? 0.0 : verify::kLossNoiseFloorFactor}});
  return c.passed;
}

}  // namespace course::chapter08
