// The schedules, their printing and their simulation.
#include "common/parallel/pipeline_schedule.h"

#include <algorithm>
#include <sstream>
#include <stdexcept>

namespace course::parallel {
namespace {

void check_sizes(int stages, int micro_batches) {
  if (stages < 1) throw std::invalid_argument("a pipeline needs at least 1 stage, not " + std::to_string(stages));
  if (micro_batches < 1)
    throw std::invalid_argument("a pipeline needs at least 1 micro-batch, not " + std::to_string(micro_batches));
}

}  // namespace

PipelineSchedule gpipe_schedule(int stages, int micro_batches) {
  check_sizes(stages, micro_batches);
  PipelineSchedule schedule(static_cast<std::size_t>(stages));
  for (auto& actions : schedule) {
    for (int i = 0; i < micro_batches; ++i) actions.push_back({PipeOp::forward, i});
    for (int i = 0; i < micro_batches; ++i) actions.push_back({PipeOp::backward, i});
  }
  return schedule;
}

PipelineSchedule one_f_one_b_schedule(int stages, int micro_batches) {
  check_sizes(stages, micro_batches);
  PipelineSchedule schedule(static_cast<std::size_t>(stages));
  for (int s = 0; s < stages; ++s) {
    auto& actions = schedule[static_cast<std::size_t>(s)];
    const int warmup = std::min(stages - s - 1, micro_batches);
    int forwards = 0, backwards = 0;
    while (forwards < warmup) actions.push_back({PipeOp::forward, forwards++});
    while (forwards < micro_batches) {  // steady state: one forward, one backward
      actions.push_back({PipeOp::forward, forwards++});
      actions.push_back({PipeOp::backward, backwards++});
    }
    while (backwards < micro_batches) actions.push_back({PipeOp::backward, backwards++});  // drain
  }
  return schedule;
}

// Megatron-LM's order (Narayanan et al. 2021): the k-th chunk-pass a rank runs forward is micro-batch
// (k / pv) p + k % p through chunk (k / p) % v; backward walks the chunks the other way. Rank s fills
// with 2 (p - s - 1) + (v - 1) p forwards (the chunk-passes in flight before its first backward can
// arrive), then alternates, then drains. With m = p there is no steady state to reach: all forwards
// first (as the paper's implementation does).
PipelineSchedule interleaved_schedule(int stages, int micro_batches, int chunks) {
  check_sizes(stages, micro_batches);
  if (chunks < 1) throw std::invalid_argument("a pipeline needs at least 1 model chunk per rank, not " + std::to_string(chunks));
  if (chunks == 1) return one_f_one_b_schedule(stages, micro_batches);
  if (micro_batches % stages != 0)
    throw std::invalid_argument("interleaved 1F1B runs the micro-batches in groups of the " + std::to_string(stages) +
                                " stages: " + std::to_string(micro_batches) + " is not a multiple of " +
                                std::to_string(stages));
  const int p = stages, v = chunks, total = micro_batches * chunks;
  auto pass = [&](PipeOp op, int k) {
    const int chunk = (k % (p * v)) / p;
    return PipeAction{op, (k / (p * v)) * p + k % p, op == PipeOp::forward ? chunk : v - 1 - chunk};
  };
  PipelineSchedule schedule(static_cast<std::size_t>(p));
  for (int s = 0; s < p; ++s) {
    auto& actions = schedule[static_cast<std::size_t>(s)];
    const int warmup = micro_batches == p ? total : std::min(2 * (p - s - 1) + (v - 1) * p, total);
    int forwards = 0, backwards = 0;
    while (forwards < warmup) actions.push_back(pass(PipeOp::forward, forwards++));
    while (forwards < total) {
      actions.push_back(pass(PipeOp::forward, forwards++));
      actions.push_back(pass(PipeOp::backward, backwards++));
    }
    while (backwards < total) actions.push_back(pass(PipeOp::backward, backwards++));
  }
  return schedule;
}

// The list scheduler on unit times: at each step each stage takes, of what its inputs and limits allow,
// the next forward, else the next backward, else the oldest W.
PipelineSchedule zero_bubble_schedule(int stages, int micro_batches) {
  check_sizes(stages, micro_batches);
  const int p = stages, m = micro_batches;
  std::vector<std::vector<int>> forward_done(static_cast<std::size_t>(p), std::vector<int>(static_cast<std::size_t>(m), -1)),
      backward_done = forward_done;
  std::vector<int> forwards(static_cast<std::size_t>(p), 0), backwards = forwards, weights = forwards;
  PipelineSchedule schedule(static_cast<std::size_t>(p));
  for (int t = 0, left = 3 * m * p; left > 0; ++t) {
    std::vector<std::pair<int, PipeAction>> step;  // decided on the state at time t, then applied
    for (int s = 0; s < p; ++s) {
      const auto S = static_cast<std::size_t>(s);
      const int f = forwards[S], b = backwards[S];
      const auto done = [t](int when) { return when >= 0 && when <= t; };
      if (f < m && f - b < p - s && f - weights[S] < p && (s == 0 || done(forward_done[S - 1][static_cast<std::size_t>(f)])))
        step.push_back({s, {PipeOp::forward, f}});
      else if (b < m && done(forward_done[S][static_cast<std::size_t>(b)]) &&
               (s == p - 1 || done(backward_done[S + 1][static_cast<std::size_t>(b)])))
        step.push_back({s, {PipeOp::backward, b}});
      else if (weights[S] < b)
        step.push_back({s, {PipeOp::weight, weights[S]}});
    }
    for (const auto& [s, a] : step) {
      const auto S = static_cast<std::size_t>(s), i = static_cast<std::size_t>(a.micro_batch);
      schedule[S].push_back(a);
      if (a.op == PipeOp::forward) forward_done[S][i] = t + 1, ++forwards[S];
      else if (a.op == PipeOp::backward) backward_done[S][i] = t + 1, ++backwards[S];
      else ++weights[S];
      --left;
    }
  }
  return schedule;
}

PipelineSchedule make_schedule(const std::string& name, int stages, int micro_batches, int chunks) {
  if (name == "interleaved") return interleaved_schedule(stages, micro_batches, chunks);
  if (chunks != 1)
    throw std::invalid_argument("the " + name + " schedule runs one chunk per rank, not " + std::to_string(chunks) +
                                " (interleaved runs several)");
  if (name == "gpipe") return gpipe_schedule(stages, micro_batches);
  if (name == "1f1b") return one_f_one_b_schedule(stages, micro_batches);
  if (name == "zero-bubble") return zero_bubble_schedule(stages, micro_batches);
  throw std::invalid_argument("unknown schedule '" + name + "' (gpipe, 1f1b, interleaved or zero-bubble)");
}

std::string describe(const PipeAction& a, bool chunked) {
  std::ostringstream out;
  out << (a.op == PipeOp::forward ? 'F' : a.op == PipeOp::backward ? 'B' : 'W') << a.micro_batch;
  if (chunked) out << '.' << a.chunk;
  return out.str();
}

std::string describe(const PipelineSchedule& schedule) {
  bool chunked = false;
  for (const auto& actions : schedule)
    for (const auto& a : actions) chunked = chunked || a.chunk != 0;
  std::ostringstream out;
  for (std::size_t s = 0; s < schedule.size(); ++s) {
    out << "stage " << s << ":";
    for (const auto& a : schedule[s]) out << ' ' << describe(a, chunked);
    out << '\n';
  }
  return out.str();
}

SimulatedPipeline simulate(const PipelineSchedule& schedule, double forward_time, double backward_time,
                           double weight_time) {
  return simulate(schedule, std::vector<StageTimes>(schedule.size(), {forward_time, backward_time, weight_time}));
}

SimulatedPipeline simulate(const PipelineSchedule& schedule, const std::vector<StageTimes>& stages) {
  const std::size_t p = schedule.size();
  if (p == 0) throw std::logic_error("a schedule of no stages");
  if (stages.size() != p)
    throw std::logic_error(std::to_string(stages.size()) + " stages' times for a schedule of " + std::to_string(p) + " stages");
  // Every stage: each micro-batch's forward and backward (and W, if the schedule splits backward) of
  // every chunk exactly once, in that order.
  int max_chunk = 0;
  bool split = false;
  for (const auto& actions : schedule)
    for (const auto& a : actions) max_chunk = std::max(max_chunk, a.chunk), split = split || a.op == PipeOp::weight;
  const std::size_t passes = split ? 3 : 2;
  const std::size_t v = static_cast<std::size_t>(max_chunk) + 1, m = schedule[0].size() / (passes * v);
  for (std::size_t s = 0; s < p; ++s) {
    if (schedule[s].size() != passes * m * v)
      throw std::logic_error("stage " + std::to_string(s) + " has " + std::to_string(schedule[s].size()) + " actions, not " +
                             std::to_string(passes) + "mv = " + std::to_string(passes * m * v));
    std::vector<int> seen(m * v, 0);
    for (const auto& a : schedule[s]) {
      if (a.micro_batch < 0 || static_cast<std::size_t>(a.micro_batch) >= m || a.chunk < 0)
        throw std::logic_error("stage " + std::to_string(s) + ": " + describe(a, v > 1) + " outside micro-batches 0.." +
                               std::to_string(m - 1));
      int& state = seen[static_cast<std::size_t>(a.micro_batch) * v + static_cast<std::size_t>(a.chunk)];
      const int expected = a.op == PipeOp::forward ? 0 : a.op == PipeOp::backward ? 1 : 2;
      if (state != expected) throw std::logic_error("stage " + std::to_string(s) + ": " + describe(a, v > 1) + " out of order");
      ++state;
    }
  }
  // forward_done[s][i v + c]: when micro-batch i's forward through chunk c finished on stage s
  // (negative: not yet); backward_done likewise.
  std::vector<std::vector<double>> forward_done(p, std::vector<double>(m * v, -1)),
      backward_done(p, std::vector<double>(m * v, -1));
  std::vector<std::size_t> next(p, 0);
  std::vector<double> free_at(p, 0);
  SimulatedPipeline result;
  result.spans.resize(p);
  result.peak_in_flight.assign(p, 0);
  std::vector<int> in_flight(p, 0);
  std::size_t remaining = passes * m * v * p;
  while (remaining > 0) {
    bool progressed = false;
    for (std::size_t s = 0; s < p; ++s) {
      while (next[s] < schedule[s].size()) {
        const PipeAction a = schedule[s][next[s]];
        const auto i = static_cast<std::size_t>(a.micro_batch), c = static_cast<std::size_t>(a.chunk);
        // The input: from the neighbour in the model's order of chunks, which wraps from the last
        // rank's chunk c to stage 0's chunk c + 1 (and back, in backward).
        double input = 0;
        if (a.op == PipeOp::forward) {
          if (s > 0) input = forward_done[s - 1][i * v + c];
          else if (c > 0) input = forward_done[p - 1][i * v + c - 1];
        } else if (a.op == PipeOp::backward) {
          if (s + 1 < p) input = backward_done[s + 1][i * v + c];
          else if (c + 1 < v) input = backward_done[0][i * v + c + 1];
        }  // W needs only its own B, earlier in the same list
        if (input < 0) break;
        const double ready = std::max(free_at[s], input);
        const StageTimes& times = stages[s];  // a chunk's pass takes 1/v of the stage's
        const double end = ready + (a.op == PipeOp::forward    ? times.forward
                                    : a.op == PipeOp::backward ? times.backward
                                                               : times.weight) / static_cast<double>(v);
        if (a.op != PipeOp::weight) (a.op == PipeOp::forward ? forward_done : backward_done)[s][i * v + c] = end;
        result.spans[s].push_back({a, ready, end});
        // A micro-batch's activations are held until its last pass: B, or W where backward is split.
        in_flight[s] += a.op == PipeOp::forward ? 1 : (a.op == (split ? PipeOp::weight : PipeOp::backward) ? -1 : 0);
        result.peak_in_flight[s] = std::max(result.peak_in_flight[s], in_flight[s] / static_cast<double>(v));
        free_at[s] = end;
        ++next[s];
        --remaining;
        progressed = true;
      }
    }
    if (!progressed) {
      std::string waiting;
      for (std::size_t s = 0; s < p; ++s)
        if (next[s] < schedule[s].size()) waiting += " stage " + std::to_string(s) + " waits at " + describe(schedule[s][next[s]], v > 1) + ";";
      throw std::logic_error("the schedule deadlocks:" + waiting);
    }
  }
  for (std::size_t s = 0; s < p; ++s) result.makespan = std::max(result.makespan, free_at[s]);
  for (std::size_t s = 0; s < p; ++s) {
    double busy = 0;
    for (const auto& span : result.spans[s]) busy += span.end - span.begin;
    result.idle_fraction.push_back(result.makespan > 0 ? 1.0 - busy / result.makespan : 0.0);
  }
  return result;
}

double bubble_fraction(int stages, int micro_batches, int chunks) {
  return static_cast<double>(stages - 1) / static_cast<double>(chunks * micro_batches + stages - 1);
}

double zero_bubble_fraction(int stages, int micro_batches) {
  const double m = micro_batches, p = stages;
  return 1.0 - 3.0 * m / std::max(3.0 * m + p - 1.0, 2.0 * m + 2.0 * p - 1.0);
}

double bubble_fraction(const std::string& schedule, int stages, int micro_batches, int chunks) {
  return schedule == "zero-bubble" ? zero_bubble_fraction(stages, micro_batches)
                                   : bubble_fraction(stages, micro_batches, chunks);
}

}  // namespace course::parallel
