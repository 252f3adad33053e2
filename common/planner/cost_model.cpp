// The cost model (cost_model.h): each term with the paper or the chapter it comes from.
#include "common/planner/cost_model.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "common/comm/simulated_network.h"
#include "common/parallel/reducer.h"

namespace course::planner {

namespace {

using std::to_string;

constexpr double kGiB = 1ull << 30;

// PyTorch's DistributedDataParallel: buckets of 25 MiB, two in flight (one filling, one reducing).
constexpr double kBucketBytes = 25.0 * (1 << 20);

// The Adam step moves, per parameter of the shard it updates, the float32 master (or parameter), the two
// moments and the gradient in (4 + 4 + 4 + 2 in mixed precision, 16 in float32) and the master, the moments
// and the 16-bit copy out (14, or 12): 28 bytes either way. Bound by memory bandwidth.
constexpr double kOptimizerBytesPerParameter = 28;

// Each micro-batch's weight gradients (in the compute precision) are added into float32 accumulators
// (Megatron-LM's main_grad; under autocast the float32 parameters' .grad): the gradient and the
// accumulator in, the accumulator out.
constexpr double kAccumulatorBytes = 4 + 4;

// Each byte the activation formula stores is written once and read once in a forward pass through the
// layer; backward, like its GEMMs, counts as two passes; a full recomputation as one more.
constexpr double kElementwiseBytesPerStoredByte = 2;

// Ops whose fixed cost (DeviceProfile::op_seconds) the measured layer ops leave out: tensor parallelism's f
// and g around each half of a block (4); outside the blocks the two tables' lookups and their sum, the
// final norm, the head and the loss (6); and the optimizer's step on each parameter tensor (12 a block:
// 6 weights, 6 biases or gains).
constexpr double kTensorParallelOpsPerLayer = 4, kOpsOutsideLayers = 6, kTensorsPerLayer = 12;

// Chapter 04's MLP layer, per output element and step, in float32: the bias add (reads and writes it), the
// ReLU forward (the same), its backward (reads the gradient and the input, writes the gradient) and the
// bias's gradient (reads it): 8 + 8 + 12 + 4 bytes, bound by memory bandwidth. Its ops, each at its fixed
// cost: forward the product, the bias add and the ReLU; backward the ReLU's, the bias's and the two
// products'. The squared loss: the difference, its square and the mean, forward and backward.
constexpr double kMlpBytesPerOutput = 32, kMlpOpsPerLayer = 7, kMlpLossOps = 6;
// An all-reduce on the CPU also does arithmetic over memory, which the ping-pong of chapter 03's link fit
// leaves out: the sum reads the received and the local values and writes the result for each element the
// ring's reduce-scatter receives ((n - 1) / n of them: 12 bytes each), and the average divides every
// element once more (reads and writes it: 8 bytes).
constexpr double kSumBytesPerElement = 12, kAverageBytesPerElement = 8;
// SGD's update reads the parameter and the gradient and writes the parameter; zeroing the gradient
// writes it once more.
constexpr double kSgdBytesPerParameter = 16;

// A GEMM of `flops` on this device, at the efficiency its size allows (cluster.h).
double gemm_seconds(double flops, const DeviceProfile& d, DType precision) {
  if (flops <= 0) return 0;
  const double efficiency = d.gemm_efficiency * flops / (flops + d.half_efficiency_flops);
  return flops / (d.peak(precision) * efficiency);
}

// A collective of `bytes` over n ranks on a link: chapter 03's alpha-beta model of the ring, as the
// simulated network computes it (comm::NetworkModel; an all-reduce 2 (n - 1) messages of bytes / n, an
// all-gather or a reduce-scatter half that).
double collective_seconds(comm::OpKind kind, double bytes, int n, const Link& link) {
  return comm::NetworkModel{link.alpha_seconds * 1e6, link.bytes_per_second / 1e9}.seconds(kind, bytes, n);
}
double all_reduce_seconds(double bytes, int n, const Link& link) {
  return collective_seconds(comm::OpKind::all_reduce, bytes, n, link);
}
double all_gather_seconds(double bytes, int n, const Link& link) {
  return collective_seconds(comm::OpKind::all_gather, bytes, n, link);
}

std::string gib(double bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f GiB", bytes / kGiB);
  return text;
}

// The first reason this configuration cannot run at all, whatever its memory, as "kind: details";
// empty when none.
std::string structural_rejection(const Workload& w, const Cluster& c, const ParallelConfig& p) {
  const auto& g = w.shape;
  if (p.dp < 1 || p.tp < 1 || p.pp < 1 || p.cp < 1 || p.micro_batch < 1 || p.virtual_stages < 1)
    return "a degree below 1: every degree and the micro-batch must be at least 1";
  if (p.gpus() != c.gpus()) return "not the cluster's GPUs: uses " + to_string(p.gpus()) + ", the cluster has " + to_string(c.gpus());
  if (p.tp > c.gpus_per_node)
    return "TP across nodes: TP " + to_string(p.tp) + " on nodes of " + to_string(c.gpus_per_node) +
           " GPUs (its all-reduces, four a layer, would cross InfiniBand)";
  if (g.heads < 1 || g.hidden % g.heads != 0)
    return "the heads do not divide the width: " + to_string(g.heads) + " heads on a width of " + to_string(g.hidden) +
           " (each head takes width / heads channels)";
  if (g.heads % p.tp != 0) return "TP does not divide the heads: TP " + to_string(p.tp) + ", " + to_string(g.heads) + " heads";
  if (g.vocabulary % p.tp != 0) return "TP does not divide the vocabulary: TP " + to_string(p.tp);
  if (p.sequence_parallel && p.tp == 1) return "sequence parallelism without TP: it splits what TP repeats";
  if (p.cp > 1 && g.sequence % (2 * p.cp) != 0)
    return "CP does not divide the sequence: CP " + to_string(p.cp) + " needs 2 x CP equal chunks (the balanced causal layout)";
  if (g.layers % (p.pp * p.virtual_stages) != 0)
    return "PP does not divide the layers: PP " + to_string(p.pp) + " x " + to_string(p.virtual_stages) + " chunks, " +
           to_string(g.layers) + " layers";
  if (p.virtual_stages > 1 && p.pp == 1) return "interleaving without PP: chunks need stages";
  if (p.zero_stage < 0 || p.zero_stage > 3) return "no such ZeRO stage: " + to_string(p.zero_stage);
  if (p.zero_stage >= 2 && p.pp > 1)
    return "ZeRO-2 or -3 with PP: the micro-batches accumulate the gradients it shards (ZeRO-" + to_string(p.zero_stage) + ")";
  const double per_step = static_cast<double>(p.dp) * p.micro_batch;
  const double m = w.global_batch / per_step;
  if (m != static_cast<double>(static_cast<long long>(m)) || m < 1)
    return "the global batch does not divide: " + to_string(static_cast<long long>(w.global_batch)) +
           " is not a multiple of DP x micro-batch, " + to_string(static_cast<long long>(per_step));
  if (p.pp > 1 && m < p.pp)
    return "too few micro-batches for the bubble: " + to_string(static_cast<long long>(m)) + " for PP " + to_string(p.pp) +
           " (every stage would idle more than it computes)";
  if (p.virtual_stages > 1 && static_cast<long long>(m) % p.pp != 0)
    return "interleaving needs the micro-batches in multiples of PP: " + to_string(static_cast<long long>(m)) + " for PP " +
           to_string(p.pp);
  return {};
}

// A collective's arithmetic on the CPU over `elements` (the whole buffer's), at the memory's bandwidth: the
// sum of what a ring receives ((n - 1) / n of them) and the average's division, over all of them after an
// all-reduce, over the rank's part after a reduce-scatter.
double reduction_seconds(comm::OpKind kind, double elements, int n, const DeviceProfile& d) {
  const double divided = kind == comm::OpKind::all_reduce ? elements : elements / n;
  return (kSumBytesPerElement * elements * (n - 1) / n + kAverageBytesPerElement * divided) / d.memory_bandwidth;
}

// A float32 collective of `elements` on this machine's CPU ranks: the link's ring, and for the ones that
// reduce, their arithmetic over memory.
double cpu_collective_seconds(comm::OpKind kind, double elements, int n, const Link& link, const DeviceProfile& d) {
  return collective_seconds(kind, 4 * elements, n, link) +
         (kind == comm::OpKind::all_gather ? 0.0 : reduction_seconds(kind, elements, n, d));
}

// Chapter 04's MLP, layer by layer: each linear layer's inputs and outputs.
std::vector<std::pair<double, double>> mlp_layers(const MlpShape& shape) {
  std::vector<std::pair<double, double>> layers;
  double in = static_cast<double>(shape.features);
  for (int layer = 0; layer <= shape.layers; ++layer) {
    const double out = layer < shape.layers ? static_cast<double>(shape.hidden) : 1.0;
    layers.emplace_back(in, out);
    in = out;
  }
  return layers;
}

}  // namespace

MlpStep predict_mlp_step(const MlpShape& shape, double global_batch, int ranks, const Cluster& c, const Bucketing& how) {
  const DeviceProfile& d = c.device;
  const double b = std::ceil(global_batch / ranks);  // the largest share
  MlpStep step;
  TimeBreakdown& t = step.time;
  double parameters = 0;
  std::vector<std::size_t> bytes;  // each gradient tensor's, in registration order: a layer's weight, its bias
  std::vector<double> backward;    // each layer's backward, in layer order
  for (const auto& [in, out] : mlp_layers(shape)) {
    const double gemm = gemm_seconds(2 * b * in * out, d, DType::float32);
    // Half the element-wise bytes forward (the bias add, the ReLU), half backward (the ReLU's, the
    // bias's); three of the ops forward, four backward.
    const double elementwise = kMlpBytesPerOutput * b * out / d.memory_bandwidth;
    const double forward = gemm + elementwise / 2 + 3 * d.op_seconds;
    backward.push_back(2 * gemm + elementwise / 2 + (kMlpOpsPerLayer - 3) * d.op_seconds);
    t.compute += forward + backward.back();
    bytes.insert(bytes.end(), {static_cast<std::size_t>(4 * in * out), static_cast<std::size_t>(4 * out)});
    parameters += in * out + out;
  }
  t.compute += kMlpLossOps * d.op_seconds;
  t.optimizer = kSgdBytesPerParameter * parameters / d.memory_bandwidth + static_cast<double>(bytes.size()) * d.op_seconds;
  if (ranks == 1) return step;
  // Backward from its start: the loss's half of its ops, then the layers last to first; a layer's two
  // gradients are in when its backward ends.
  std::vector<double> ready(bytes.size());
  double clock = kMlpLossOps / 2 * d.op_seconds;
  for (std::size_t layer = backward.size(); layer-- > 0;) {
    clock += backward[layer];
    ready[2 * layer] = ready[2 * layer + 1] = clock;
  }
  const double backward_ends = clock;
  std::vector<std::size_t> order(bytes.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = order.size() - 1 - i;  // reverse registration
  const auto buckets = parallel::assign_buckets_by_size(order, bytes, static_cast<std::size_t>(how.first_cap_bytes),
                                                        static_cast<std::size_t>(how.cap_bytes));
  double link_free = how.overlap ? 0.0 : backward_ends;
  for (const auto& bucket : buckets) {
    double in_bucket = 0, complete = 0;
    for (std::size_t i : bucket) in_bucket += static_cast<double>(bytes[i]), complete = std::max(complete, ready[i]);
    double seconds = cpu_collective_seconds(comm::OpKind::all_reduce, in_bucket / 4, ranks, c.intra, d);
    if (how.simulated) seconds = std::max(seconds, all_reduce_seconds(in_bucket, ranks, *how.simulated));
    link_free = std::max(link_free, complete) + seconds;
    step.communication += seconds;
  }
  step.buckets = static_cast<int>(buckets.size());
  t.dp = std::max(0.0, link_free - backward_ends);
  if (how.average_loss)  // the loss, averaged for the log: one element
    t.dp += cpu_collective_seconds(comm::OpKind::all_reduce, 1, ranks, c.intra, d);
  return step;
}

TimeBreakdown predict_zero_mlp_step(const MlpShape& shape, double global_batch, int ranks, const Cluster& c, int stage) {
  const DeviceProfile& d = c.device;
  TimeBreakdown t;
  t.compute = predict_mlp_step(shape, global_batch, ranks, c, {.average_loss = false}).time.compute;
  std::vector<double> units;  // each layer's parameters (its weight and bias): stage 2 and 3's units
  double psi = 0;
  for (const auto& [in, out] : mlp_layers(shape)) psi += units.emplace_back(in * out + out);
  const auto collective = [&](comm::OpKind kind) {
    return [&, kind](double elements) { return cpu_collective_seconds(kind, elements, ranks, c.intra, d); };
  };
  const auto all_reduce = collective(comm::OpKind::all_reduce), reduce_scatter = collective(comm::OpKind::reduce_scatter),
             all_gather = collective(comm::OpKind::all_gather);
  const double part = stage == 0 ? psi : psi / ranks;  // the parameters whose update this rank computes
  if (ranks > 1) {
    if (stage == 0) t.dp += all_reduce(psi);
    if (stage == 1) t.dp += reduce_scatter(psi) + all_gather(psi);
    if (stage == 2) {
      for (double u : units) t.dp += reduce_scatter(u);
      t.dp += all_gather(psi);
    }
    if (stage == 3)
      for (double u : units) t.dp += 2 * all_gather(u) + reduce_scatter(u);
    t.dp += all_reduce(1);                   // the loss, averaged for the log
    if (stage > 0) t.dp += all_reduce(1);    // the squared norm of the parts, for the clip
  }
  // AdamW moves 28 bytes a parameter it updates (kOptimizerBytesPerParameter); the norm reads each
  // gradient once more; an op per tensor (stage 0) or per flat part.
  t.optimizer = (kOptimizerBytesPerParameter + 4) * part / d.memory_bandwidth +
                static_cast<double>(stage == 0 ? 2 * units.size() : units.size()) * d.op_seconds;
  return t;
}

std::string describe(const ParallelConfig& p) {
  std::string text = "TP(" + to_string(p.tp) + ")-PP(" + to_string(p.pp) + ")";
  if (p.cp > 1) text += "-CP(" + to_string(p.cp) + ")";
  text += "-DP(" + to_string(p.dp) + ") mb " + to_string(p.micro_batch);
  if (p.virtual_stages > 1) text += " v " + to_string(p.virtual_stages);
  if (p.zero_stage > 0) text += " ZeRO-" + to_string(p.zero_stage);
  if (p.recompute != Recompute::none) text += std::string(" ") + nn::recompute_name(p.recompute);
  if (p.sequence_parallel) text += " SP";
  return text;
}

Prediction predict(const Workload& w, const Cluster& c, const ParallelConfig& p) {
  Prediction out;
  out.config = p;
  out.rejected = structural_rejection(w, c, p);
  if (!out.rejected.empty()) return out;
  const auto& g = w.shape;
  const DeviceProfile& d = c.device;
  const double l = static_cast<double>(g.layers), h = static_cast<double>(g.hidden), a = static_cast<double>(g.heads);
  const double s = static_cast<double>(g.sequence), V = static_cast<double>(g.vocabulary);
  const double t = p.tp, b = p.micro_batch, pp = p.pp, v = p.virtual_stages;
  const double s_local = s / p.cp;        // this rank's tokens of each sequence
  const double unit = static_cast<double>(element_size(w.precision));  // an activation's bytes
  const double m = w.global_batch / (static_cast<double>(p.dp) * b);
  out.micro_batches = static_cast<int>(m);
  const double layers_per_stage = l / pp;
  const int sharding_group = p.dp * p.cp;  // ZeRO and the gradients' average span DP and CP alike

  // ---- memory, on the first stage (the token table; the most micro-batches in flight) and on the last
  // (the tied table's copy and the float32 logits); the larger counts.
  // Megatron-LM 2021 section 5.1: a layer holds 12 h^2 + 13 h parameters, the tables V h and s h.
  const double layer_parameters = (12 * h * h + 13 * h) / t;
  const double table = V * h / t;
  const double first_stage_parameters = layers_per_stage * layer_parameters + table + s * h;
  const double last_stage_parameters = layers_per_stage * layer_parameters + (pp > 1 ? table : 0);
  GptShape local = g;
  local.sequence = static_cast<std::int64_t>(s_local);
  const double precision_factor = unit / 2;  // Korthikanti et al.'s bytes are for 16-bit activations
  const double stored_per_layer =
      precision_factor * activation_bytes_per_layer(local, b, p.tp, p.sequence_parallel, p.recompute);
  const double whole_layer = precision_factor * activation_bytes_per_layer(local, b, p.tp, p.sequence_parallel,
                                                                           Recompute::none);
  // In flight under 1F1B: PP micro-batches on the first stage, one on the last (Narayanan et al. 2021);
  // interleaving keeps 1 + (PP - 1) / (PP v) times more (Korthikanti et al. 2022, section 4.2.3).
  const double in_flight_first = std::min(m, pp) * (v > 1 ? 1 + (pp - 1) / (pp * v) : 1);
  const double logits = 4 * s_local * b * V / t;  // float32 logits for the loss, on the last stage
  // What else the last stage keeps for backward: the loss's float32 probabilities, and the final norm's
  // input and output (the head's input).
  const double last_stage_extra = logits + 2 * unit * s_local * b * h;
  auto stage_memory = [&](double parameters, double in_flight, bool last) {
    MemoryBreakdown memory;
    const ModelStates states = zero_model_states(p.zero_stage, parameters, sharding_group, w.precision);
    memory.parameters = states.params;
    memory.gradients = states.grads;
    memory.optimizer = states.optimizer;
    memory.activations = in_flight * layers_per_stage * stored_per_layer + (last ? logits + last_stage_extra : 0);
    // Recomputing a layer holds its whole activations again for a moment; DDP's buckets; ZeRO-3's
    // gathered layer (its 16-bit weights, and the next one prefetched).
    if (p.recompute != Recompute::none) memory.buffers += whole_layer - stored_per_layer;
    if (sharding_group > 1) memory.buffers += std::min(2 * kBucketBytes, states.grads);
    if (p.zero_stage == 3) memory.buffers += 2 * layer_parameters * unit;
    return memory;
  };
  const MemoryBreakdown first = stage_memory(first_stage_parameters, in_flight_first, pp == 1);
  const MemoryBreakdown last = stage_memory(last_stage_parameters, 1, true);
  out.memory = pp == 1 || first.total() >= last.total() ? first : last;

  // ---- time, on the last stage (the logits make it the slowest)
  // A layer's GEMMs per micro-batch forward (Megatron-LM 2021 section 5.1, this rank's share): Q, K, V,
  // the projection and the MLP's two, 24 b s h^2 / t; the scores and their weighted sum, 4 b s^2 h / t.
  const double tokens = b * s_local;
  const double projection_gemms = gemm_seconds(2 * tokens * 3 * h * h / t, d, w.precision) +      // Q, K, V
                                   gemm_seconds(2 * tokens * h * h / t, d, w.precision) +          // projection
                                   2 * gemm_seconds(2 * tokens * 4 * h * h / t, d, w.precision);  // the MLP's two
  // The scores and the weighted sum: one batched GEMM each over this rank's heads of the micro-batch.
  const double heads_here = b * a / t;
  const double attention_gemms = 2 * gemm_seconds(heads_here * 2 * s_local * s * (h / a), d, w.precision);
  // The element-wise work moves the layer's activations through memory (kElementwiseBytesPerStoredByte);
  // the attention's share of them is its 5 a s / h term.
  const double elementwise = kElementwiseBytesPerStoredByte * whole_layer / d.memory_bandwidth;
  const double attention_share =
      p.sequence_parallel ? (5 * a * s_local / h) / (34 + 5 * a * s_local / h)
                          : (5 * a * s_local / (h * t)) / (10 + 24 / t + 5 * a * s_local / (h * t));
  // A CPU's measured ops (DeviceProfile: zero on a GPU), forward and backward together: the layer's
  // element-wise ops at their own cost rather than the memory's speed, attention per sequence-head pair
  // rather than as GEMMs, and the fixed cost of the tensor-parallel ops.
  const bool measured_ops = d.elementwise_seconds_per_element > 0;
  const double measured_elementwise = d.elementwise_fixed_seconds + d.elementwise_seconds_per_element * tokens * h;
  // Ring attention computes CP blocks for each sequence-head pair, each at the pair's fixed cost.
  const double measured_attention = heads_here * d.attention_seconds_per_head * p.cp;
  const double measured_layer = measured_ops ? measured_elementwise + measured_attention : 0;
  const double forward = projection_gemms + (measured_ops ? 0 : attention_gemms + elementwise);
  double recomputation = 0;
  if (p.recompute == Recompute::full) recomputation = forward + measured_layer / 3;
  if (p.recompute == Recompute::selective)
    recomputation = measured_ops ? measured_attention / 3 : attention_gemms + attention_share * elementwise;
  const double layer_compute = 3 * forward + recomputation + measured_layer +
                               (p.tp > 1 ? kTensorParallelOpsPerLayer * d.op_seconds : 0);
  const double head_compute = 3 * gemm_seconds(2 * tokens * h * V / t, d, w.precision) +
                              3 * kElementwiseBytesPerStoredByte * logits / d.memory_bandwidth +
                              kOpsOutsideLayers * d.op_seconds;
  // Tensor parallelism (Megatron-LM 2019): two all-reduces of the layer's output forward, two backward,
  // two more in a full recomputation's forward (with sequence parallelism a reduce-scatter and an
  // all-gather each, the same bytes); one more each way at the embedding and the head.
  const double activation_message = tokens * h * unit;
  const int tp_all_reduces = p.recompute == Recompute::full ? 6 : 4;
  const double tp_layer = tp_all_reduces * all_reduce_seconds(activation_message, p.tp, c.intra);
  const double tp_head = 2 * all_reduce_seconds(activation_message, p.tp, c.intra);
  // Context parallelism, ring attention (Liu et al. 2023): each of the CP - 1 steps passes a block of K
  // and V, hidden behind the attention on the block before (1 / CP of the layer's); backward passes them
  // again with their gradients. Within a node while TP x CP fits one.
  const Link& cp_link = p.tp * p.cp <= c.gpus_per_node ? c.intra : c.inter;
  const double kv_block = 2 * tokens * (h / t) * unit;
  const double passes_of_attention = p.recompute == Recompute::none ? 3 : 4;
  const double cp_layer = p.cp == 1 ? 0
                                    : passes_of_attention * (p.cp - 1) *
                                          std::max(0.0, cp_link.seconds(kv_block) - attention_gemms / p.cp);
  const double stage_parameters = std::max(first_stage_parameters, last_stage_parameters);
  const double accumulate = stage_parameters * (unit + kAccumulatorBytes) / d.memory_bandwidth;
  const double per_micro_batch =
      layers_per_stage * (layer_compute + tp_layer + cp_layer) + head_compute + tp_head + accumulate;
  out.time.compute = m * (layers_per_stage * layer_compute + head_compute + accumulate);
  out.time.tp = m * (layers_per_stage * tp_layer + tp_head);
  out.time.cp = m * layers_per_stage * cp_layer;
  // Pipeline parallelism: each micro-batch's activation in and its gradient out, at each of the v chunks'
  // boundaries; across nodes once the stages do not fit one. Megatron-LM 2021 section 4.1 scatters the
  // message over the TP ranks' adapters, 1 / t of it each, and the receiving ranks all-gather it over
  // NVLink before the next chunk can start; under sequence parallelism each rank's 1 / t is all its
  // next peer needs, so nothing is gathered.
  if (p.pp > 1) {
    const bool across = p.tp * p.cp * p.pp > c.gpus_per_node;
    const Link& link = across ? c.inter : c.intra;
    double message = link.seconds(activation_message / (across ? t : 1));
    if (across && p.tp > 1 && !p.sequence_parallel) message += all_gather_seconds(activation_message, p.tp, c.intra);
    out.time.pp = 2 * v * m * message;
  }
  // The bubble: (PP - 1) / v micro-batches' time at the start and the end (Narayanan et al. 2021).
  out.time.bubble = (pp - 1) / v * per_micro_batch;
  // Data parallelism: the gradients' all-reduce (ZeRO-1 and -2: a reduce-scatter, then the parameters'
  // all-gather after the step, the same bytes; ZeRO-3 gathers the parameters for each micro-batch's
  // forward and backward as well), across nodes once a replica and its peers do not fit one. DDP's
  // buckets overlap it with the last micro-batch's backward (chapter 05).
  if (sharding_group > 1) {
    const Link& link = p.gpus() > c.gpus_per_node ? c.inter : c.intra;
    double seconds = all_reduce_seconds(stage_parameters * unit, sharding_group, link);
    if (p.zero_stage == 3) seconds += 2 * m * all_gather_seconds(stage_parameters * unit, sharding_group, link);
    const double backward_window = layers_per_stage * (2 * forward);
    out.time.dp = std::max(0.0, seconds - backward_window);
  }
  const double shard = stage_parameters / (p.zero_stage >= 1 ? sharding_group : 1);
  const double tensors = kTensorsPerLayer * layers_per_stage + 2;  // and the two tables (or the final norm)
  out.time.optimizer = kOptimizerBytesPerParameter * shard / d.memory_bandwidth + tensors * d.op_seconds;

  const double seconds = out.time.total();
  out.tokens_per_second = w.global_batch * s / seconds;
  out.tflops_per_gpu =
      flops_per_iteration(g, w.global_batch, p.recompute == Recompute::full) / seconds / p.gpus() / 1e12;
  out.mfu = flops_per_iteration(g, w.global_batch, false) / seconds / p.gpus() / d.peak(w.precision);
  const double usable = kUsableMemoryFraction * d.memory_bytes;
  if (out.memory.total() > usable)
    out.rejected = "out of memory: needs " + gib(out.memory.total()) + ", " + gib(usable) + " usable";
  return out;
}

}  // namespace course::planner
