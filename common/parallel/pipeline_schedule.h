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
// Both idle for (p - 1)/(m + p - 1) of the step when every stage takes as long (the bubble).
#pragma once
#include <string>
#include <vector>

namespace course::parallel {

enum class PipeOp { forward, backward };

struct PipeAction {
  PipeOp op;
  int micro_batch;
  bool operator==(const PipeAction& other) const { return op == other.op && micro_batch == other.micro_batch; }
};

// schedule[s] is stage s's list of actions, in order.
using PipelineSchedule = std::vector<std::vector<PipeAction>>;

// Throws std::invalid_argument unless stages >= 1 and micro_batches >= 1.
PipelineSchedule gpipe_schedule(int stages, int micro_batches);
PipelineSchedule one_f_one_b_schedule(int stages, int micro_batches);
// "gpipe" or "1f1b"; throws std::invalid_argument naming the others for anything else.
PipelineSchedule make_schedule(const std::string& name, int stages, int micro_batches);

// One line per stage: "stage 0: F0 F1 B0 F2 B1 B2".
std::string describe(const PipelineSchedule& schedule);

// The schedule run on an ideal machine: a forward takes forward_time, a backward backward_time, a
// transfer nothing; an action starts once its stage is free and its input exists (the forward of the
// same micro-batch on the stage before; the backward of the same micro-batch on the stage after).
struct SimulatedPipeline {
  struct Span {
    PipeAction action;
    double begin, end;
  };
  std::vector<std::vector<Span>> spans;  // per stage, in order
  double makespan = 0;
  std::vector<double> idle_fraction;     // per stage: 1 - busy / makespan
  std::vector<int> peak_in_flight;       // per stage: most micro-batches forwarded and not yet backwarded
};
// Throws std::logic_error when the schedule cannot finish (a stage waits for an input that its
// neighbour's order never produces: a deadlock), or when a stage's list is not every micro-batch's
// forward and backward exactly once, the forward first.
SimulatedPipeline simulate(const PipelineSchedule& schedule, double forward_time = 1.0, double backward_time = 2.0);

// The bubble of the theory: (p - 1) / (m + p - 1).
double bubble_fraction(int stages, int micro_batches);

}  // namespace course::parallel
