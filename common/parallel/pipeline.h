// Pipeline parallelism: the GPT cut by layers into stages, one per rank of a pipeline group, and the
// loop that executes a schedule (pipeline_schedule.h) on it. The first stage holds the embeddings and
// its blocks, the last its blocks, the final norm and the head; micro-batches flow forward as
// activations [micro-batch, T, C] sent to the next stage, and backward as their gradients sent to the
// one before. GPT-2's head is tied to the token table, which the first and the last stage both need:
// each holds a copy, and after backward the two add each other's gradient (Megatron-LM's embedding
// group), so the copies stay equal. With a tensor-parallel group as well, each stage's blocks are
// tensor-parallel (tensor_parallel_gpt.h), the table and the head vocabulary-parallel, and the loss the
// parallel cross-entropy: TP x PP, and with data parallelism on top, 3D. With sequence parallelism
// as well, the activations between blocks, and so those sent between stages, are each TP rank's
// shard of the sequence, [micro-batch, T / tp, C]. A one-stage pipeline is the whole GPT, split by TP.
// With v model chunks per rank (interleaved 1F1B, pipeline_schedule.h) the layers are cut into v p
// pieces and rank r holds pieces r, r + p, ..., r + (v - 1) p: a micro-batch passes every rank v times,
// from the last rank back to the first between chunks. With a context-parallel group
// (context_parallel.h) each stage holds its rank's tokens of every sequence: the first stage takes
// them from the ids, attention runs through the group, and the last stage's loss counts its tokens.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/comm/communicator.h"
#include "common/nn/gpt.h"
#include "common/optim/mixed_precision.h"
#include "common/parallel/context_parallel.h"
#include "common/parallel/ddp.h"
#include "common/parallel/pipeline_schedule.h"
#include "common/parallel/tensor_parallel.h"

namespace course::parallel {

class PipelineStageGPT : public TensorParallelModule {
 public:
  // Stage `pp.rank()` of `pp.size()`, taking its layers of `full` (which every rank made with the same
  // seed), split across `tp` when given, and along the sequence too with `sequence_parallel`. Throws
  // UsageError when the layers do not divide by the stages (or the heads, the vocabulary or, with
  // sequence parallelism, the sequence by the tensor-parallel ranks).
  // `chunks` (v): model chunks per rank; the layers must divide into v p pieces. `cp`: the context-
  // parallel group's attention (held by the caller, outliving the stage), or none; not with
  // sequence parallelism.
  PipelineStageGPT(const nn::GPT& full, comm::Communicator& pp, comm::Communicator* tp = nullptr,
                   bool sequence_parallel = false, int chunks = 1, const ContextParallel* cp = nullptr);
  // First stage: ids [B, T] -> [B, T, C]; middle: [B, T, C] -> [B, T, C]; last: [B, T, C] (or ids, for
  // a single stage) -> logits [B * T, V] (this rank's vocabulary slice, [B * T, V / tp], with TP).
  // With sequence parallelism, T / tp in place of T between stages; with context parallelism T / cp
  // everywhere after the ids (this rank's tokens, ContextParallel::positions). One chunk per rank only (throws
  // std::logic_error otherwise: run the chunks one at a time).
  Tensor forward(const Tensor& input) override;
  // Chunk `chunk` of this rank: the same, where the model's first piece (rank 0's chunk 0) takes ids
  // and its last (the last rank's last chunk) gives logits.
  Tensor forward_chunk(int chunk, const Tensor& input);
  int chunks() const { return static_cast<int>(chunk_blocks_.size()); }
  // Each chunk's parameters as a module of its own, named as the whole model's (the tables with the
  // chunk that uses them): what data parallelism wraps, one DistributedDataParallel per chunk as
  // Megatron-LM wraps each virtual stage, since each backward pass reaches one chunk's parameters only.
  std::vector<std::shared_ptr<nn::Module>> chunk_modules();
  bool starts(int chunk) const { return first_ && chunk == 0; }           // takes the ids
  bool ends(int chunk) const { return last_ && chunk + 1 == chunks(); }  // gives the logits
  // What a stage receives for a micro-batch of `batch` sequences of `t` tokens (not the first stage).
  Shape activation_shape(std::int64_t batch, std::int64_t t) const;
  bool is_split(const std::string& name) const override;
  bool counts_once(const std::string& name) const override;
  Tensor part_of(const std::string& name, const Tensor& whole) const override;
  // The last stage's loss of its logits: the mean cross-entropy (the parallel one with TP) of the
  // targets [B, T] (or [B * T]; [B, T] with context parallelism). With context parallelism, this rank's
  // tokens' share of the whole sequences' mean times the group's size, so that the average over the
  // data- and context-parallel ranks (DDP on Topology::dp_cp_group) is the replicas' mean.
  Tensor loss(const Tensor& logits, const Tensor& targets, int ignore_index);
  bool is_first() const { return first_; }  // holds the embeddings
  bool is_last() const { return last_; }    // holds the final norm and the head
  // After backward: the first and the last stage add each other's gradient of the tied table.
  void sync_tied_gradients() override;
  // After backward, with sequence parallelism: adds the partial gradients of the parameters whole on
  // every TP rank over the TP group (all_reduce_gradients).
  void sync_sequence_parallel_gradients() override;
  const nn::GPTConfig& config() const { return config_; }

 private:
  nn::GPTConfig config_;
  Tensor& table();  // the token table this stage holds (the tied one)
  comm::Communicator& pp_;
  comm::Communicator* tp_;
  bool sequence_parallel_;
  const ContextParallel* cp_;  // null without context parallelism
  bool first_, last_;
  Tensor wte_, wpe_;  // wte_ on the first stage (embedding) and the last (head); wpe_ on the first
  std::shared_ptr<VocabParallelEmbedding> wte_parallel_;  // instead of wte_, with TP
  std::vector<std::vector<std::shared_ptr<nn::Module>>> chunk_blocks_;  // per chunk, its blocks in order
  std::shared_ptr<nn::LayerNorm> ln_f_;
};

// One executed action, for the timeline (Chrome trace) and the bubble.
struct TimedAction {
  PipeAction action;
  double begin_ms, end_ms;  // from the start of the step; begins once its input has arrived
};

struct PipelineStep {
  float loss = 0;                    // the global batch's mean loss, on every stage
  std::vector<TimedAction> timeline;  // this stage's actions
  double step_ms = 0;                 // the whole step, this stage
  std::int64_t peak_activation_bytes = 0;  // this stage, above what it held before the step
};

// One step's forward and backward passes of `schedule` on this stage: micro-batch i is ids[i] with
// targets[i] (every stage gets them: the first for its input, the last for its loss, the others for
// the shapes). Each micro-batch's loss is weighted by its share of the counted targets, so the
// gradients are those of the whole batch's mean. Leaves the gradients accumulated in the parameters;
// finish_gradients (tensor_parallel.h) and the optimizer step are the caller's. With `ddp` (data parallelism on top: the
// stage, or each of its chunks, wrapped in chapter 04/05's DistributedDataParallel on its DP group),
// every backward but the chunk's last runs under no_sync, so the replicas average the accumulated
// gradients once, in buckets during the last.
// The pipeline group and this stage's neighbours in it, as the topology gives them
// (Topology::previous_stage and next_stage: -1 at the ends of the pipeline).
struct PipelineLinks {
  comm::Communicator& group;
  int previous = -1, next = -1;
  // A pipeline group on its own (a test, or a pipeline outside a grid): its ranks are the stages in order.
  static PipelineLinks along(comm::Communicator& group);
};

// Each micro-batch's weight in a step's mean loss: its share of the targets that count (those not
// `ignore_index`), so the weighted sum of the micro-batches' mean losses is the whole batch's mean.
std::vector<float> micro_batch_weights(const std::vector<Tensor>& targets, int ignore_index);

// `precision`: the run's (a Recipe's mixed_precision()): the forwards under its autocast, backward from
// each loss times its loss scale (fp16; the caller unscales). None: float32, unscaled.
// `ddp`: none, or one per chunk (DDP of the stage itself, or of its chunk_modules()); each chunk's last
// backward synchronises its replicas.
PipelineStep run_pipeline(PipelineStageGPT& stage, const PipelineLinks& links, const PipelineSchedule& schedule,
                          const std::vector<Tensor>& ids, const std::vector<Tensor>& targets, int ignore_index = -100,
                          const std::vector<DistributedDataParallel*>& ddp = {},
                          const optim::MixedPrecision* precision = nullptr);

}  // namespace course::parallel
