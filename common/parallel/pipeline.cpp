// The GPT's pipeline stages and the schedule's executor.
#include "common/parallel/pipeline.h"

#include <chrono>
#include <optional>
#include <stdexcept>

#include "common/autograd/autograd.h"
#include "common/core/errors.h"
#include "common/core/memory.h"
#include "common/faults/faults.h"
#include "common/ops/autocast.h"
#include "common/ops/ops.h"
#include "common/parallel/tensor_parallel_gpt.h"

namespace course::parallel {
namespace {

Tensor copy_parameter(const Tensor& t) {
  MemoryCategoryScope scope(MemoryCategory::parameters);
  return t.detach().clone();
}

}  // namespace

PipelineStageGPT::PipelineStageGPT(const nn::GPT& full, comm::Communicator& pp, comm::Communicator* tp,
                                   bool sequence_parallel, int chunks, const ContextParallel* cp)
    : config_(full.config()), pp_(pp), tp_(tp && tp->size() > 1 ? tp : nullptr), sequence_parallel_(sequence_parallel && tp_),
      cp_(cp && cp->size() > 1 ? cp : nullptr), first_(pp.rank() == 0), last_(pp.rank() + 1 == pp.size()) {
  if (tp_) check_tensor_parallel(config_, tp_->size());
  if (cp_ && sequence_parallel_)
    throw UsageError("--cp: context parallelism splits every sequence already; not with --sequence-parallel");
  if (chunks < 1) throw std::invalid_argument("PipelineStageGPT: " + std::to_string(chunks) + " chunks per rank");
  const std::int64_t stages = pp.size(), pieces = stages * chunks;
  if (config_.n_layer % pieces != 0)
    throw UsageError("--n-layer: " + std::to_string(config_.n_layer) + " layers do not divide among " +
                     std::to_string(stages) + " pipeline stages" +
                     (chunks > 1 ? " of " + std::to_string(chunks) + " chunks each" : std::string()));
  const std::int64_t per_piece = config_.n_layer / pieces;
  // GPT-2's names, so a stage's parameters read as the whole model's: "transformer.h.2.attn...".
  auto transformer = register_module("transformer", std::make_shared<nn::ModuleDict>());
  if ((first_ || last_) && tp_)
    wte_parallel_ = transformer->register_module("wte", std::make_shared<VocabParallelEmbedding>(full.wte, *tp_, sequence_parallel_));
  else if (first_ || last_)
    wte_ = transformer->register_parameter("wte.weight", copy_parameter(full.wte));
  if (first_) wpe_ = transformer->register_parameter("wpe.weight", copy_parameter(full.wpe));
  auto layers = transformer->register_module("h", std::make_shared<nn::ModuleDict>());
  chunk_blocks_.resize(static_cast<std::size_t>(chunks));
  for (int c = 0; c < chunks; ++c) {
    const std::int64_t first_layer = (c * stages + pp.rank()) * per_piece;  // piece c p + r of the model
    for (std::int64_t i = first_layer; i < first_layer + per_piece; ++i) {
      // A copy of the whole model's block: the same layers, the same values, parameters of its own.
      const nn::Block& source = *full.blocks()[static_cast<std::size_t>(i)];
      std::shared_ptr<nn::Module> block;
      if (tp_) {
        block = std::make_shared<TensorParallelBlock>(source, config_, *tp_, sequence_parallel_);
      } else {
        block = std::make_shared<nn::Block>(config_, full.wte.device(), 0);
        const auto from = source.named_parameters();
        auto to = block->named_parameters();
        for (std::size_t k = 0; k < to.size(); ++k) {
          autograd::NoGradGuard no_grad;
          Tensor(to[k].second).copy_from(from[k].second);
        }
      }
      if (cp_) {  // attention over the whole sequence, through the context-parallel group
        nn::AttentionCore core = [cp = cp_](const Tensor& qkv, std::int64_t heads, bool keep) {
          return cp->attention(qkv, heads, keep);
        };
        if (tp_) std::static_pointer_cast<TensorParallelBlock>(block)->set_attention_core(core);
        else std::static_pointer_cast<nn::Block>(block)->attn->core = core;
      }
      chunk_blocks_[static_cast<std::size_t>(c)].push_back(layers->register_module(std::to_string(i), block));
    }
  }
  if (last_) {
    ln_f_ = transformer->register_module("ln_f", std::make_shared<nn::LayerNorm>(config_.n_embd, full.wte.device()));
    autograd::NoGradGuard no_grad;
    ln_f_->weight.copy_from(full.ln_f().weight);
    ln_f_->bias.copy_from(full.ln_f().bias);
  }
}

Tensor PipelineStageGPT::forward(const Tensor& input) {
  if (chunks() != 1) throw std::logic_error("PipelineStageGPT::forward: this rank holds " + std::to_string(chunks()) +
                                            " chunks; run them one at a time (forward_chunk)");
  return forward_chunk(0, input);
}

Tensor PipelineStageGPT::forward_chunk(int chunk, const Tensor& input) {
  Tensor x = input;
  if (starts(chunk)) {
    // The positions of the tokens this rank holds: all of them, with sequence parallelism its shard's,
    // with context parallelism its tokens' (and only those ids are looked up).
    const std::int64_t t = input.dim(1), shard = sequence_parallel_ ? t / tp_->size() : t;
    if (sequence_parallel_ && t % tp_->size() != 0)
      throw std::invalid_argument("sequence parallelism: " + std::to_string(t) + " tokens do not divide among " +
                                  std::to_string(tp_->size()) + " tensor-parallel ranks");
    const std::int64_t first = sequence_parallel_ ? shard * tp_->rank() : 0;
    std::vector<float> positions(static_cast<std::size_t>(shard));
    for (std::int64_t i = 0; i < shard; ++i) positions[static_cast<std::size_t>(i)] = static_cast<float>(first + i);
    Tensor ids = input;
    if (cp_) {
      cp_->check(t, config_.n_head / (tp_ ? tp_->size() : 1));
      positions.clear();
      for (const std::int64_t p : cp_->positions(t)) positions.push_back(static_cast<float>(p));
      ids = cp_->shard(input);
    }
    const auto held = static_cast<std::int64_t>(positions.size());
    Tensor tokens = tp_ ? (*wte_parallel_)(ids) : embedding(ids, wte_);
    x = add(tokens, embedding(Tensor::from_host(positions, {held}, input.device()), wpe_));
  }
  for (auto& block : chunk_blocks_.at(static_cast<std::size_t>(chunk))) x = (*block)(x);
  if (!ends(chunk)) return x;
  x = (*ln_f_)(x);
  if (tp_) return wte_parallel_->logits(x);  // gathers the sequence first, with sequence parallelism
  return matmul(reshape(x, {x.dim(0) * x.dim(1), config_.n_embd}), wte_, false, true);
}

std::vector<std::shared_ptr<nn::Module>> PipelineStageGPT::chunk_modules() {
  std::vector<std::shared_ptr<nn::Module>> out;
  for (int c = 0; c < chunks(); ++c) {
    auto chunk = std::make_shared<nn::ModuleDict>();
    auto transformer = chunk->register_module("transformer", std::make_shared<nn::ModuleDict>());
    if (starts(c) || ends(c)) {  // the table: the embedding's on the first chunk, the head's on the last
      if (wte_parallel_) transformer->register_module("wte", wte_parallel_);
      else transformer->register_parameter("wte.weight", wte_);
    }
    if (starts(c)) transformer->register_parameter("wpe.weight", wpe_);
    auto layers = transformer->register_module("h", std::make_shared<nn::ModuleDict>());
    for (const auto& [name, module] : named_modules())
      for (const auto& block : chunk_blocks_[static_cast<std::size_t>(c)])
        if (module == block.get()) layers->register_module(name.substr(name.rfind('.') + 1), block);
    if (ends(c)) transformer->register_module("ln_f", ln_f_);
    out.push_back(chunk);
  }
  return out;
}

Shape PipelineStageGPT::activation_shape(std::int64_t batch, std::int64_t t) const {
  return {batch, sequence_parallel_ ? t / tp_->size() : cp_ ? t / cp_->size() : t, config_.n_embd};
}

bool PipelineStageGPT::is_split(const std::string& name) const { return tp_ && gpt_cut(name) != GptCut::whole; }

bool PipelineStageGPT::counts_once(const std::string& name) const {
  const bool tied_copy = name == "transformer.wte.weight" && last_ && !first_;  // the first stage's counts
  return (!tp_ || tp_->size() == 1 || is_split(name) || tp_->rank() == 0) && !tied_copy;
}

Tensor PipelineStageGPT::part_of(const std::string& name, const Tensor& whole) const {
  return tp_ ? gpt_part(name, whole, *tp_) : whole;
}

namespace {

// The gradients of the row-parallel layers' biases, whole on every TP rank: what chapter 08's faults of
// the sequence-parallel sum break.
std::vector<Tensor> row_parallel_bias_gradients(const nn::Module& stage) {
  std::vector<Tensor> gradients;
  for (const auto& [name, p] : stage.named_parameters())
    if (name.ends_with(".c_proj.bias") && p.grad().defined()) gradients.push_back(p.grad());
  return gradients;
}

}  // namespace

void PipelineStageGPT::sync_sequence_parallel_gradients() {
  if (!sequence_parallel_) return;
  std::vector<Tensor> whole;
  for (const auto& [name, p] : named_parameters())
    if (!is_split(name)) whole.push_back(p);
  // --fault sp-unsummed-bias (chapter 08, the run's model): the last TP rank keeps its own shard's partial
  // gradients of the row-parallel biases, as if it had left them out of the sum.
  std::vector<Tensor> kept;
  if (tp_->rank() == tp_->size() - 1 && faults::active("sp-unsummed-bias", this))
    for (const Tensor& g : row_parallel_bias_gradients(*this)) kept.push_back(g.clone());
  all_reduce_gradients(whole, *tp_);
  autograd::NoGradGuard no_grad;
  auto biases = row_parallel_bias_gradients(*this);
  for (std::size_t i = 0; i < kept.size(); ++i) biases[i].copy_from(kept[i]);
  // --fault sp-average-biases (chapter 08): the row-parallel biases' partial gradients averaged over the
  // group, as data parallelism's are, where each rank's shard of the sequence adds its own part. Every
  // rank makes the same mistake, so their copies stay alike; it acts in the whole process, so the 16-bit
  // check's split reference makes it too, and only the whole model sees it.
  if (faults::active("sp-average-biases"))
    for (Tensor& g : biases) g.copy_from(scale(g, 1.0f / static_cast<float>(tp_->size())));
}

Tensor PipelineStageGPT::loss(const Tensor& logits, const Tensor& targets_in, int ignore_index) {
  if (!cp_) {
    const Tensor targets = reshape(targets_in, {targets_in.numel()});
    return tp_ ? parallel_cross_entropy(logits, targets, wte_parallel_->first_row(), *tp_, ignore_index)
               : cross_entropy(logits, targets, ignore_index);
  }
  if (targets_in.shape().size() != 2)
    throw std::invalid_argument("PipelineStageGPT::loss: with context parallelism the targets are [B, T], got " +
                                shape_string(targets_in.shape()));
  // This rank's tokens' sum over the whole sequences' count of targets, times the group's size.
  double counted = 0, mine = 0;
  for (float t : targets_in.to_host()) counted += static_cast<int>(t) != ignore_index;
  if (counted == 0) throw std::invalid_argument("PipelineStageGPT::loss: every target is ignored");
  const Tensor targets = reshape(cp_->shard(targets_in), {logits.dim(0)});
  for (float t : targets.to_host()) mine += static_cast<int>(t) != ignore_index;
  const auto share = static_cast<float>(cp_->size() / counted);
  if (tp_)  // the parallel cross-entropy is the mean over this rank's counted targets (0 with none)
    return scale(parallel_cross_entropy(logits, targets, wte_parallel_->first_row(), *tp_, ignore_index),
                 static_cast<float>(mine) * share);
  return scale(sum(cross_entropy_per_row(logits, targets, ignore_index)), share);
}

Tensor& PipelineStageGPT::table() { return tp_ ? wte_parallel_->weight : wte_; }

void PipelineStageGPT::sync_tied_gradients() {
  if (pp_.size() == 1 || !(first_ || last_) || !table().grad().defined()) return;
  // The first and the last stage swap their gradients of the table and each adds the other's (with
  // TP, the ranks of one TP coordinate, which hold the same rows).
  const Tensor& tied = table();
  const int peer = first_ ? pp_.size() - 1 : 0;
  Tensor theirs = Tensor::empty(tied.shape(), tied.device());
  pp_.send_recv(tied.grad(), peer, theirs, peer, /*tag=*/1 << 20);
  Tensor grad = tied.grad();
  autograd::NoGradGuard no_grad;
  grad.copy_from(add(grad, theirs));
}

PipelineLinks PipelineLinks::along(comm::Communicator& group) {
  const int s = group.rank();
  return {group, s > 0 ? s - 1 : -1, s + 1 < group.size() ? s + 1 : -1};
}

std::vector<float> micro_batch_weights(const std::vector<Tensor>& targets, int ignore_index) {
  std::vector<double> counted(targets.size(), 0);
  double total = 0;
  for (std::size_t i = 0; i < targets.size(); ++i) {
    for (float t : targets[i].to_host()) counted[i] += static_cast<int>(t) != ignore_index;
    total += counted[i];
  }
  std::vector<float> weights(targets.size(), 0.0f);
  for (std::size_t i = 0; i < targets.size(); ++i) weights[i] = total > 0 ? static_cast<float>(counted[i] / total) : 0.0f;
  return weights;
}

PipelineStep run_pipeline(PipelineStageGPT& stage, const PipelineLinks& links, const PipelineSchedule& schedule,
                          const std::vector<Tensor>& ids, const std::vector<Tensor>& targets, int ignore_index,
                          const std::vector<DistributedDataParallel*>& ddp, const optim::MixedPrecision* precision) {
  // The schedule under autocast, which its forwards obey (a backward replays what its forward recorded);
  // each last stage's backward starts from its loss times the loss scale.
  Autocast autocast(precision ? precision->dtype() : DType::float32);
  const float loss_scale = precision ? precision->loss_scale() : 1.0f;
  comm::Communicator& pp = links.group;
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  const auto since = [&] { return std::chrono::duration<double, std::milli>(Clock::now() - start).count(); };
  const std::size_t m = ids.size(), v = static_cast<std::size_t>(stage.chunks());
  const int s = pp.rank();
  const Device device = ids.front().device();
  const std::int64_t before = memory_stats(device).current_of(MemoryCategory::activations);
  reset_peak_memory(device);

  const std::vector<float> weights = micro_batch_weights(targets, ignore_index);
  // Per micro-batch i and chunk c, at i v + c: what the chunk received and what it produced.
  std::vector<Tensor> inputs(m * v), outputs(m * v);
  std::vector<comm::WorkHandle> sends;
  PipelineStep step;
  double loss = 0;
  const auto tag = [v](std::size_t i, int c, bool gradient) {
    return static_cast<int>(2 * (i * v + static_cast<std::size_t>(c)) + (gradient ? 1 : 0));
  };
  // The neighbours in the model's order: the stage before and after, and between chunks the wrap from
  // the last stage to the first (interleaved 1F1B).
  const int last = pp.size() - 1;
  const int from = links.previous >= 0 ? links.previous : last, to = links.next >= 0 ? links.next : 0;
  const auto& actions = schedule.at(static_cast<std::size_t>(s));
  std::vector<std::size_t> last_backward(v, 0);  // per chunk
  bool split = false;  // zero bubble: backward's B now, its W (the weights' gradients) where the schedule says
  for (std::size_t k = 0; k < actions.size(); ++k) {
    if (actions[k].op == PipeOp::backward) last_backward[static_cast<std::size_t>(actions[k].chunk)] = k;
    split = split || actions[k].op == PipeOp::weight;
  }
  if (!ddp.empty() && ddp.size() != v)
    throw std::invalid_argument("run_pipeline: " + std::to_string(ddp.size()) + " DistributedDataParallel for " +
                                std::to_string(v) + " chunks");
  if (!ddp.empty() && split)
    throw std::invalid_argument("run_pipeline: a schedule with W passes defers the weights' gradients, which DDP's "
                                "buckets wait for at the end of each backward: not with data parallelism");
  std::vector<autograd::DeferredWeightGradients> deferred(split ? m * v : 0);  // each micro-batch's W, until it runs
  for (std::size_t k = 0; k < actions.size(); ++k) {
    const PipeAction& a = actions[k];
    const auto i = static_cast<std::size_t>(a.micro_batch);
    const int c = a.chunk;
    const std::size_t at = i * v + static_cast<std::size_t>(c);
    double begin = since();  // moved past any wait for the input: a stage waiting is the bubble
    const std::int64_t batch = ids[i].dim(0), t = ids[i].dim(1);
    if (a.op == PipeOp::weight) {
      deferred[at].run();
    } else if (a.op == PipeOp::forward) {
      if (stage.starts(c)) {
        inputs[at] = ids[i];
      } else {
        inputs[at] = Tensor::empty(stage.activation_shape(batch, t), device);  // float32: the residual stream
        pp.recv(inputs[at], from, tag(i, s == 0 ? c - 1 : c, false));
        inputs[at].set_requires_grad(true);
        begin = since();
      }
      Tensor out = stage.forward_chunk(c, inputs[at]);
      if (stage.ends(c)) {
        outputs[at] = scale(stage.loss(out, reshape(targets[i], {batch, t}), ignore_index), weights[i]);
        loss += outputs[at].item();
      } else {
        outputs[at] = out;
        // The residual stream, float32 (under autocast too, as in PyTorch), which the next stage expects.
        sends.push_back(pp.send_async(out.detach().to(DType::float32), to, tag(i, c, false)));
      }
    } else {
      std::optional<DistributedDataParallel::NoSyncGuard> accumulate_only;  // the replicas average once, at the last
      if (!ddp.empty() && k != last_backward[static_cast<std::size_t>(c)]) accumulate_only.emplace(*ddp[static_cast<std::size_t>(c)]);
      Tensor root = outputs[at], grad;
      if (stage.ends(c)) {
        if (loss_scale != 1.0f) root = scale(root, loss_scale);
      } else {
        grad = Tensor::empty(outputs[at].shape(), device, outputs[at].dtype());
        pp.recv(grad, to, tag(i, c, true));
        begin = since();
      }
      if (split) deferred[at] = autograd::backward_deferring_weights(root, grad);
      else autograd::backward(root, grad);
      if (!stage.starts(c)) sends.push_back(pp.send_async(inputs[at].grad(), from, tag(i, s == 0 ? c - 1 : c, true)));
      outputs[at] = Tensor();  // the micro-batch's activations go with its graph
      inputs[at] = Tensor();
    }
    step.timeline.push_back({a, begin, since()});
    // A send holds its tensor until it completes: let the finished ones go now, or every micro-batch's
    // activation would stay until the step ends, and 1F1B's bound (p micro-batches in flight) with it.
    std::erase_if(sends, [](const comm::WorkHandle& work) { return work->test(); });
  }
  for (auto& work : sends) work->wait();
  step.step_ms = since();
  step.peak_activation_bytes = memory_stats(device).peak_of(MemoryCategory::activations) - before;
  // The loss is known on the last stage; every stage reports it.
  Tensor global = Tensor::from_host({static_cast<float>(loss)}, {1});
  pp.broadcast(global, pp.size() - 1);
  step.loss = global.item();
  return step;
}

}  // namespace course::parallel
