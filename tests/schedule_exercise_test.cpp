// Exercise 08.1, chapter 08's 1F1B schedule (08_tensor_pipeline/schedule.cpp): by hand, against its
// properties on an ideal machine (it finishes, every stage holds at most p - s micro-batches, its bubble is
// the theory's), and against the library's schedule, for 1 to 6 stages and 1 to 10 micro-batches.
#include <gtest/gtest.h>

#include <stdexcept>

#include "08_tensor_pipeline/schedule.h"

namespace course::testing {
namespace {

// Three stages, four micro-batches: stage 0 fills with two forwards, stage 1 with one, stage 2 alternates.
TEST(Exercise08, ThreeStagesFourMicroBatchesByHand) {
  EXPECT_EQ(parallel::describe(chapter08::one_f_one_b(3, 4)),
            "stage 0: F0 F1 F2 B0 F3 B1 B2 B3\n"
            "stage 1: F0 F1 B0 F2 B1 F3 B2 B3\n"
            "stage 2: F0 B0 F1 B1 F2 B2 F3 B3\n");
}

// Fewer micro-batches than stages: the fill stops at m, and nothing is left out.
TEST(Exercise08, FewerMicroBatchesThanStages) {
  EXPECT_EQ(parallel::describe(chapter08::one_f_one_b(4, 2)),
            "stage 0: F0 F1 B0 B1\nstage 1: F0 F1 B0 B1\nstage 2: F0 F1 B0 B1\nstage 3: F0 B0 F1 B1\n");
}

// Every shape: it can run (no stage waits forever), stage s holds at most p - s micro-batches (GPipe's m),
// its bubble is (p - 1) / (m + p - 1), and it is the library's schedule.
TEST(Exercise08, EveryShapeRunsWithinItsMemoryAndBubble) {
  for (int p = 1; p <= 6; ++p)
    for (int m = 1; m <= 10; ++m) {
      const auto schedule = chapter08::one_f_one_b(p, m);
      ASSERT_EQ(static_cast<int>(schedule.size()), p) << p << " stages, " << m << " micro-batches";
      parallel::SimulatedPipeline simulated;
      try {
        simulated = parallel::simulate(schedule, 1.0, 1.0);
      } catch (const std::logic_error& e) {
        ADD_FAILURE() << p << " stages, " << m << " micro-batches: the schedule cannot run: " << e.what();
        continue;
      }
      for (int s = 0; s < p; ++s)
        EXPECT_LE(simulated.peak_in_flight[static_cast<std::size_t>(s)], std::min(p - s, m))
            << "stage " << s << " of " << p << " with " << m << " micro-batches holds too many at once";
      EXPECT_NEAR(simulated.idle_fraction[0], parallel::bubble_fraction(p, m), 1e-12) << p << " stages, " << m;
      EXPECT_EQ(schedule, parallel::one_f_one_b_schedule(p, m)) << p << " stages, " << m << " micro-batches";
    }
}

// What the chapter plays: its own 1F1B, checked; the other schedules the library's.
TEST(Exercise08, TheChapterPlaysItsOwn1F1B) {
  EXPECT_EQ(chapter08::schedule_for("1f1b", 3, 5, 1), chapter08::one_f_one_b(3, 5));
  EXPECT_EQ(chapter08::schedule_for("gpipe", 3, 5, 1), parallel::gpipe_schedule(3, 5));
}

}  // namespace
}  // namespace course::testing
