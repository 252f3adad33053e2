// Pipeline schedules as data: every stage runs each micro-batch's forward and backward once, in an order
// that never deadlocks, for every m >= 1 and p <= 8; with balanced stages each idles exactly the bubble
// of the theory, (p - 1)/(m + p - 1); GPipe holds all m micro-batches in flight and 1F1B at most p - s.
// Interleaved 1F1B with v <= 4 chunks per rank, for every p <= 8 and every multiple m <= 32 of p: never
// a deadlock, and exactly (p - 1)/(v m + p - 1) idle, the paper's (p - 1)/(v m) of the ideal time.
// Zero bubble (ZB-H1) with F, B and W one unit each, for every p <= 8 and m <= 32: never a deadlock,
// (p - 1)/(3m + p - 1) idle for m >= p (a third of 1F1B's idle time), and no more in flight than 1F1B.
#include <gtest/gtest.h>

#include <stdexcept>

#include "common/parallel/pipeline_schedule.h"

namespace course::parallel {
namespace {

TEST(PipelineSchedule, TheOrdersAreTheOnesOfThePapers) {
  EXPECT_EQ(describe(gpipe_schedule(2, 3)), "stage 0: F0 F1 F2 B0 B1 B2\nstage 1: F0 F1 F2 B0 B1 B2\n");
  // 1F1B: stage s fills with p - s - 1 forwards, then alternates, then drains.
  EXPECT_EQ(describe(one_f_one_b_schedule(3, 4)),
            "stage 0: F0 F1 F2 B0 F3 B1 B2 B3\n"
            "stage 1: F0 F1 B0 F2 B1 F3 B2 B3\n"
            "stage 2: F0 B0 F1 B1 F2 B2 F3 B3\n");
  // Fewer micro-batches than stages: the fill stops at m.
  EXPECT_EQ(describe(one_f_one_b_schedule(4, 1)), "stage 0: F0 B0\nstage 1: F0 B0\nstage 2: F0 B0\nstage 3: F0 B0\n");
}

TEST(PipelineSchedule, NeverDeadlocksAndIdlesTheBubble) {
  for (const std::string name : {"gpipe", "1f1b"})
    for (int p = 1; p <= 8; ++p)
      for (int m = 1; m <= 32; ++m) {
        SCOPED_TRACE(name + " p=" + std::to_string(p) + " m=" + std::to_string(m));
        const auto schedule = make_schedule(name, p, m);
        ASSERT_EQ(schedule.size(), static_cast<std::size_t>(p));
        const auto run = simulate(schedule, 1.0, 2.0);  // throws on a deadlock or a malformed list
        EXPECT_DOUBLE_EQ(run.makespan, 3.0 * (m + p - 1));
        for (int s = 0; s < p; ++s) {
          EXPECT_NEAR(run.idle_fraction[static_cast<std::size_t>(s)], bubble_fraction(p, m), 1e-12) << "stage " << s;
          const int expected_peak = name == "gpipe" ? m : std::min(p - s, m);
          EXPECT_EQ(run.peak_in_flight[static_cast<std::size_t>(s)], expected_peak) << "stage " << s;
        }
      }
}

TEST(PipelineSchedule, InterleavedIsMegatronsOrder) {
  // p = 2, m = 4, v = 2: groups of 2 micro-batches, chunk 0 then chunk 1; stage 0 fills with
  // 2 (p - 1) + (v - 1) p = 4 chunk-passes, stage 1 with 2.
  EXPECT_EQ(describe(interleaved_schedule(2, 4, 2)),
            "stage 0: F0.0 F1.0 F0.1 F1.1 F2.0 B0.1 F3.0 B1.1 F2.1 B0.0 F3.1 B1.0 B2.1 B3.1 B2.0 B3.0\n"
            "stage 1: F0.0 F1.0 F0.1 B0.1 F1.1 B1.1 F2.0 B0.0 F3.0 B1.0 F2.1 B2.1 F3.1 B3.1 B2.0 B3.0\n");
  EXPECT_EQ(interleaved_schedule(3, 6, 1), one_f_one_b_schedule(3, 6));
  EXPECT_EQ(make_schedule("interleaved", 2, 4, 2), interleaved_schedule(2, 4, 2));
}

// The interleaved bubble: a micro-batch passes each rank v times, each pass 1/v of a stage's work, so
// the fill and the drain take (p - 1)/v stage-times each way: a makespan of 3m + 3(p - 1)/v (forward 1,
// backward 2) and (p - 1)/(v m + p - 1) of it idle on every stage. In flight at the peak: the fill of
// 2 (p - s - 1) + (v - 1) p chunk-passes and one more (all m v of them when m = p), each 1/v of a stage's
// activations: more than 1F1B's p - s, the price of the smaller bubble.
TEST(PipelineSchedule, InterleavedNeverDeadlocksAndIdlesItsBubble) {
  for (int v = 2; v <= 4; ++v)
    for (int p = 1; p <= 8; ++p)
      for (int m = p; m <= 32; m += p) {
        SCOPED_TRACE("v=" + std::to_string(v) + " p=" + std::to_string(p) + " m=" + std::to_string(m));
        const auto run = simulate(interleaved_schedule(p, m, v), 1.0, 2.0);  // throws on a deadlock
        EXPECT_NEAR(run.makespan, 3.0 * m + 3.0 * (p - 1) / v, 1e-9);
        for (int s = 0; s < p; ++s) {
          EXPECT_NEAR(run.idle_fraction[static_cast<std::size_t>(s)], bubble_fraction(p, m, v), 1e-12) << "stage " << s;
          const int passes = m == p ? m * v : std::min(2 * (p - s - 1) + (v - 1) * p + 1, m * v);
          EXPECT_DOUBLE_EQ(run.peak_in_flight[static_cast<std::size_t>(s)], static_cast<double>(passes) / v) << "stage " << s;
        }
        // The ratio the paper states: bubble time over ideal time, (p - 1)/(v m).
        const double ideal = 3.0 * m;
        EXPECT_NEAR((run.makespan - ideal) / ideal, static_cast<double>(p - 1) / (v * m), 1e-12);
      }
}

// ZB-H1's order at p = 3, m = 4: 1F1B's forwards and backwards, each W where the stage would wait.
TEST(PipelineSchedule, ZeroBubbleFillsTheWaitsWithTheWeightsHalf) {
  EXPECT_EQ(describe(zero_bubble_schedule(3, 4)),
            "stage 0: F0 F1 F2 B0 W0 F3 B1 W1 B2 W2 B3 W3\n"
            "stage 1: F0 F1 B0 F2 B1 W0 F3 B2 W1 B3 W2 W3\n"
            "stage 2: F0 B0 F1 B1 F2 B2 W0 F3 B3 W1 W2 W3\n");
  // Worked by hand on unit times: stage 0 idles at t = 3, 4 waiting for B0; stage 2 at t = 0, 1
  // waiting for F0; every stage 12 units busy of 14 = 3m + p - 1.
}

// 1F1B's idle time is (p - 1)(F + B + W) per stage; ZB-H1's (p - 1)(F + B - W) (Qi et al. 2023): with
// each one unit, a makespan of 3m + p - 1 and (p - 1)/(3m + p - 1) of it idle on every stage once m >= p
// (below, the first W's come too late to fill: 2m + 2p - 1). Peak in flight: at most p, 1F1B's stage 0.
TEST(PipelineSchedule, ZeroBubbleNeverDeadlocksAndIdlesAThirdOf1F1B) {
  for (int p = 1; p <= 8; ++p)
    for (int m = 1; m <= 32; ++m) {
      SCOPED_TRACE("p=" + std::to_string(p) + " m=" + std::to_string(m));
      const auto schedule = make_schedule("zero-bubble", p, m);
      const auto run = simulate(schedule, 1.0, 1.0, 1.0);  // throws on a deadlock or a malformed list
      EXPECT_DOUBLE_EQ(run.makespan, std::max(3.0 * m + p - 1, 2.0 * m + 2.0 * p - 1));
      for (int s = 0; s < p; ++s) {
        EXPECT_NEAR(run.idle_fraction[static_cast<std::size_t>(s)], zero_bubble_fraction(p, m), 1e-12) << "stage " << s;
        EXPECT_LE(run.peak_in_flight[static_cast<std::size_t>(s)], std::min(p, m)) << "stage " << s;
      }
      if (m >= p && p > 1) {  // a third of 1F1B's idle time, whose B is B + W here
        const auto one_f_one_b = simulate(one_f_one_b_schedule(p, m), 1.0, 2.0);
        EXPECT_NEAR(run.makespan - 3.0 * m, (one_f_one_b.makespan - 3.0 * m) / 3.0, 1e-12);
      }
    }
}

// Unequal stages (the last one also runs the head and the loss): in 1F1B the slowest stage runs without
// a pause once its first input arrives, so the step is the others' one pass each plus m of its own,
// sum_{s != k} (f_s + b_s) + m (f_k + b_k), and a faster stage idles more than the theory's bubble.
TEST(PipelineSchedule, UnequalStagesWaitForTheSlowest) {
  for (int p = 2; p <= 4; ++p)
    for (int m = p; m <= 16; ++m) {
      SCOPED_TRACE("p=" + std::to_string(p) + " m=" + std::to_string(m));
      std::vector<StageTimes> times(static_cast<std::size_t>(p), {1.0, 2.0, 1.0});
      times.back() = {1.25, 2.5, 1.0};
      const auto run = simulate(one_f_one_b_schedule(p, m), times);
      const double others = 3.0 * (p - 1), slowest = 3.75;
      EXPECT_NEAR(run.makespan, others + m * slowest, 1e-9);
      EXPECT_NEAR(run.idle_fraction.back(), others / (others + m * slowest), 1e-12);
      EXPECT_NEAR(run.idle_fraction.front(), 1.0 - 3.0 * m / (others + m * slowest), 1e-12);
      EXPECT_GT(run.idle_fraction.front(), bubble_fraction(p, m));
      // Equal times given per stage are the scalar simulation's, span for span.
      const auto equal = simulate(one_f_one_b_schedule(p, m), std::vector<StageTimes>(static_cast<std::size_t>(p)));
      EXPECT_EQ(equal.makespan, simulate(one_f_one_b_schedule(p, m)).makespan);
    }
  EXPECT_THROW(simulate(one_f_one_b_schedule(2, 4), std::vector<StageTimes>(3)), std::logic_error);
}

TEST(PipelineSchedule, ABadOrderIsCaught) {
  // Stage 0 waits for B0 before F1; stage 1 runs F1 before B0: each waits for the other.
  PipelineSchedule crossed = {{{PipeOp::forward, 0}, {PipeOp::backward, 0}, {PipeOp::forward, 1}, {PipeOp::backward, 1}},
                              {{PipeOp::forward, 0}, {PipeOp::forward, 1}, {PipeOp::backward, 0}, {PipeOp::backward, 1}}};
  try {
    simulate(crossed);
    FAIL() << "a deadlock went unnoticed";
  } catch (const std::logic_error& e) {
    EXPECT_NE(std::string(e.what()).find("deadlocks: stage 0 waits at B0; stage 1 waits at F1;"), std::string::npos)
        << e.what();
  }
  PipelineSchedule backward_first = {{{PipeOp::backward, 0}, {PipeOp::forward, 0}}};
  EXPECT_THROW(simulate(backward_first), std::logic_error);
  PipelineSchedule twice = {{{PipeOp::forward, 0}, {PipeOp::forward, 0}}};
  EXPECT_THROW(simulate(twice), std::logic_error);
  EXPECT_THROW(make_schedule("zigzag", 2, 2), std::invalid_argument);
  EXPECT_THROW(make_schedule("1f1b", 2, 0), std::invalid_argument);
  EXPECT_THROW(make_schedule("gpipe", 0, 2), std::invalid_argument);
  EXPECT_THROW(make_schedule("interleaved", 4, 6, 2), std::invalid_argument);  // 6 micro-batches: not groups of 4
  EXPECT_THROW(make_schedule("interleaved", 2, 4, 0), std::invalid_argument);
  EXPECT_THROW(make_schedule("1f1b", 2, 4, 2), std::invalid_argument);  // one chunk per rank
  // Interleaved chunks out of order: stage 0 runs micro-batch 0's second chunk before its first.
  PipelineSchedule chunk_first = {{{PipeOp::forward, 0, 1}, {PipeOp::forward, 0, 0}, {PipeOp::backward, 0, 0},
                                   {PipeOp::backward, 0, 1}}};
  try {
    simulate(chunk_first);
    FAIL() << "a chunk before its input went unnoticed";
  } catch (const std::logic_error& e) {
    EXPECT_NE(std::string(e.what()).find("deadlocks: stage 0 waits at F0.1;"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace course::parallel
