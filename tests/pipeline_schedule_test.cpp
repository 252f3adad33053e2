// Pipeline schedules as data: every stage runs each micro-batch's forward and backward once, in an order
// that never deadlocks, for every m >= 1 and p <= 8; with balanced stages each idles exactly the bubble
// of the theory, (p - 1)/(m + p - 1); GPipe holds all m micro-batches in flight and 1F1B at most p - s.
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
}

}  // namespace
}  // namespace course::parallel
