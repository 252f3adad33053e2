// The two schedules, their printing and their simulation.
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

PipelineSchedule make_schedule(const std::string& name, int stages, int micro_batches) {
  if (name == "gpipe") return gpipe_schedule(stages, micro_batches);
  if (name == "1f1b") return one_f_one_b_schedule(stages, micro_batches);
  throw std::invalid_argument("unknown schedule '" + name + "' (gpipe or 1f1b)");
}

std::string describe(const PipelineSchedule& schedule) {
  std::ostringstream out;
  for (std::size_t s = 0; s < schedule.size(); ++s) {
    out << "stage " << s << ":";
    for (const auto& a : schedule[s]) out << ' ' << (a.op == PipeOp::forward ? 'F' : 'B') << a.micro_batch;
    out << '\n';
  }
  return out.str();
}

SimulatedPipeline simulate(const PipelineSchedule& schedule, double forward_time, double backward_time) {
  const std::size_t p = schedule.size();
  if (p == 0) throw std::logic_error("a schedule of no stages");
  // Every stage: each micro-batch's forward and backward exactly once, the forward first.
  std::size_t m = schedule[0].size() / 2;
  for (std::size_t s = 0; s < p; ++s) {
    if (schedule[s].size() != 2 * m) throw std::logic_error("stage " + std::to_string(s) + " has " +
                                                           std::to_string(schedule[s].size()) + " actions, not 2m");
    std::vector<int> seen(m, 0);
    for (const auto& a : schedule[s]) {
      if (a.micro_batch < 0 || static_cast<std::size_t>(a.micro_batch) >= m)
        throw std::logic_error("stage " + std::to_string(s) + ": micro-batch " + std::to_string(a.micro_batch) +
                               " outside 0.." + std::to_string(m - 1));
      int& state = seen[static_cast<std::size_t>(a.micro_batch)];
      const int expected = a.op == PipeOp::forward ? 0 : 1;
      if (state != expected)
        throw std::logic_error("stage " + std::to_string(s) + ": " + (a.op == PipeOp::forward ? "F" : "B") +
                               std::to_string(a.micro_batch) + " out of order");
      ++state;
    }
  }
  // done[op][s][i]: when that action finished (negative: not yet).
  std::vector<std::vector<double>> forward_done(p, std::vector<double>(m, -1)),
      backward_done(p, std::vector<double>(m, -1));
  std::vector<std::size_t> next(p, 0);
  std::vector<double> free_at(p, 0);
  SimulatedPipeline result;
  result.spans.resize(p);
  result.peak_in_flight.assign(p, 0);
  std::vector<int> in_flight(p, 0);
  std::size_t remaining = 2 * m * p;
  while (remaining > 0) {
    bool progressed = false;
    for (std::size_t s = 0; s < p; ++s) {
      while (next[s] < schedule[s].size()) {
        const PipeAction a = schedule[s][next[s]];
        const auto i = static_cast<std::size_t>(a.micro_batch);
        double ready = free_at[s];
        if (a.op == PipeOp::forward) {
          if (s > 0) {
            if (forward_done[s - 1][i] < 0) break;
            ready = std::max(ready, forward_done[s - 1][i]);
          }
        } else {
          if (s + 1 < p) {
            if (backward_done[s + 1][i] < 0) break;
            ready = std::max(ready, backward_done[s + 1][i]);
          }
        }
        const double end = ready + (a.op == PipeOp::forward ? forward_time : backward_time);
        (a.op == PipeOp::forward ? forward_done : backward_done)[s][i] = end;
        result.spans[s].push_back({a, ready, end});
        in_flight[s] += a.op == PipeOp::forward ? 1 : -1;
        result.peak_in_flight[s] = std::max(result.peak_in_flight[s], in_flight[s]);
        free_at[s] = end;
        ++next[s];
        --remaining;
        progressed = true;
      }
    }
    if (!progressed) {
      std::string waiting;
      for (std::size_t s = 0; s < p; ++s)
        if (next[s] < schedule[s].size()) {
          const auto& a = schedule[s][next[s]];
          waiting += " stage " + std::to_string(s) + " waits at " + (a.op == PipeOp::forward ? "F" : "B") +
                     std::to_string(a.micro_batch) + ";";
        }
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

double bubble_fraction(int stages, int micro_batches) {
  return static_cast<double>(stages - 1) / static_cast<double>(micro_batches + stages - 1);
}

}  // namespace course::parallel
