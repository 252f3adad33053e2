// Pipeline schedules as data. A schedule is, for every stage, the ordered list of what it does: the
// forward or the backward of one micro-batch. It can be printed, checked and simulated before anything
// runs, and one small loop executes it (each stage walks its list, receiving what an action needs from
// its neighbour and sending what it produces).
//
//   GPipe (Huang et al., NeurIPS 2019): every forward, then every backward. Simple; each stage holds
//   the activations of all m micro-batches at once.
//   1F1B (PipeDream-Flush: Narayanan et al., "Memory-Efficient Pipeline-Parallel DNN Training", ICML
//   2021): stage s runs min(p - s - 1, m) forwards to fill the pipeline, then alternates one forward and
//   one backward, then drains the backwards. The same bubble, but at most p - s micro-batches in flight.
//
//   Interleaved 1F1B (Narayanan et al., "Efficient Large-Scale Language Model Training on GPU Clusters
//   Using Megatron-LM", SC 2021, section 2.2): each rank holds v model chunks instead of one stage
//   (rank r the chunks r, r + p, ..., r + (v - 1) p of the v p in the model), so a micro-batch passes
//   every rank v times. The same fill, steady state and drain, over m v chunk-passes: micro-batches
//   go through in groups of p, chunk 0 for a group, then chunk 1, ..., then the next group. Each
//   chunk-pass takes 1/v of a stage's time, so the fill and the drain shrink v-fold, at the price of
//   v times the messages.
//
//   Zero bubble, ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024): backward split in
//   two, B (the activations' gradients, which the stage before waits for) and W (the weights', which
//   nothing waits for; autograd::backward_deferring_weights). 1F1B's order for F and B, and each W
//   where the stage would otherwise wait; at most p micro-batches in flight on any stage, 1F1B's peak.
//
// GPipe and 1F1B idle for (p - 1)/(m + p - 1) of the step when every stage takes as long (the bubble);
// interleaved, (p - 1)/(v m + p - 1): the bubble's time over the ideal's, (p - 1)/(v m), is the paper's.
// Zero bubble, with F, B and W each one unit: (p - 1)/(3m + p - 1) for m >= p, a third of 1F1B's
// (p - 1)(T_F + T_B - T_W) of idle time, the paper's, against 1F1B's (p - 1)(T_F + T_B + T_W).
#pragma once
#include <string>
#include <vector>

namespace course::parallel {

// backward: the whole backward, or with zero bubble its B half; weight: zero bubble's W half.
enum class PipeOp { forward, backward, weight };

struct PipeAction {
  PipeOp op;
  int micro_batch;
  int chunk = 0;  // which of this rank's model chunks (interleaved 1F1B); 0 for one stage per rank
  bool operator==(const PipeAction& other) const {
    return op == other.op && micro_batch == other.micro_batch && chunk == other.chunk;
  }
};

// schedule[s] is stage s's list of actions, in order.
using PipelineSchedule = std::vector<std::vector<PipeAction>>;

// Throws std::invalid_argument unless stages >= 1 and micro_batches >= 1.
PipelineSchedule gpipe_schedule(int stages, int micro_batches);
PipelineSchedule one_f_one_b_schedule(int stages, int micro_batches);
// v = `chunks` model chunks per rank (1: one_f_one_b_schedule). Throws std::invalid_argument unless
// chunks >= 1 and, with more than one, the micro-batches are a multiple of the stages (the paper's
// condition: they go through in groups of p).
PipelineSchedule interleaved_schedule(int stages, int micro_batches, int chunks);
// ZB-H1: made by running F before B before W, each as soon as it may, with 1F1B's limit of p - s
// forwards ahead of the backwards on stage s and p ahead of the W's, on an ideal machine where each
// takes one unit (the paper's handcrafted schedule; any m >= 1).
PipelineSchedule zero_bubble_schedule(int stages, int micro_batches);
// "gpipe", "1f1b", "interleaved" (with `chunks`) or "zero-bubble"; throws std::invalid_argument naming
// the others for anything else.
PipelineSchedule make_schedule(const std::string& name, int stages, int micro_batches, int chunks = 1);

// One line per stage: "stage 0: F0 F1 B0 F2 B1 B2"; with chunks, the chunk after a dot: "F0.1"; W3
// for zero bubble's weight half.
std::string describe(const PipelineSchedule& schedule);
// One action: "F3", or with `chunked` "F3.1" (micro-batch 3 through chunk 1).
std::string describe(const PipeAction& action, bool chunked);

// The schedule run on an ideal machine: a forward of a whole stage takes forward_time, a backward
// backward_time (of one of v chunks, 1/v of them), zero bubble's W weight_time (its B backward_time),
// a transfer nothing; an action starts once its stage
// is free and its input exists: the forward of the same micro-batch and chunk on the stage before (for
// stage 0, of the chunk before on the last stage), the backward of the same micro-batch and chunk on
// the stage after (for the last stage, of the chunk after on stage 0).
struct SimulatedPipeline {
  struct Span {
    PipeAction action;
    double begin, end;
  };
  std::vector<std::vector<Span>> spans;  // per stage, in order
  double makespan = 0;
  std::vector<double> idle_fraction;     // per stage: 1 - busy / makespan
  // Per stage: most micro-batches forwarded and not yet backwarded (with W, not yet through W), in
  // whole stages' worth of activations (a chunk's counts 1/v: the chunk-passes in flight over v).
  std::vector<double> peak_in_flight;
};
// Throws std::logic_error when the schedule cannot finish (a stage waits for an input that its
// neighbour's order never produces: a deadlock), or when a stage's list is not every micro-batch's
// forward and backward (and W, in every stage or none) of every chunk exactly once, in that order.
SimulatedPipeline simulate(const PipelineSchedule& schedule, double forward_time = 1.0, double backward_time = 2.0,
                           double weight_time = 1.0);

// One stage's own times (its forward, backward and W of one micro-batch through all its chunks). The
// theory's bubble assumes equal stages; a measured pipeline's are not (the last stage also runs the head
// and the loss), and the schedule simulated with each stage's measured times says what that costs.
struct StageTimes {
  double forward = 1.0, backward = 2.0, weight = 1.0;
};
// As above, with stage s taking stages[s]'s times (one entry per stage).
SimulatedPipeline simulate(const PipelineSchedule& schedule, const std::vector<StageTimes>& stages);

// The bubble of the theory, the share of the step a stage idles: (p - 1) / (v m + p - 1).
double bubble_fraction(int stages, int micro_batches, int chunks = 1);
// Zero bubble's, with F, B and W one unit each: 1 - 3m / max(3m + p - 1, 2m + 2p - 1) (below p
// micro-batches the first backward cannot come back before the forwards run out).
double zero_bubble_fraction(int stages, int micro_batches);
// The schedule's own (by name, as make_schedule takes it).
double bubble_fraction(const std::string& schedule, int stages, int micro_batches, int chunks = 1);

}  // namespace course::parallel
