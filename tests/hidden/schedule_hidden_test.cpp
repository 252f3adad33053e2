// Exercise 08.1's hidden graded tests (run by `exercises.py grade`, kept out of the participant's copy):
// pipelines deeper and longer than the visible tests' (up to 10 stages, 24 micro-batches), each run on
// an ideal machine and held against the library's schedule.
#include <gtest/gtest.h>

#include <stdexcept>

#include "08_tensor_pipeline/schedule.h"

namespace course::testing {
namespace {

TEST(Hidden08, DeepAndLongPipelinesRunAndAreTheLibrarys) {
  for (int p = 7; p <= 10; ++p)
    for (int m : {1, 6, 7, 11, 24}) {
      const auto schedule = chapter08::one_f_one_b(p, m);
      try {
        const auto simulated = parallel::simulate(schedule, 1.0, 2.0);  // a backward twice a forward's time
        for (int s = 0; s < p; ++s)
          EXPECT_LE(simulated.peak_in_flight[static_cast<std::size_t>(s)], std::min(p - s, m))
              << "stage " << s << " of " << p << " with " << m << " micro-batches holds too many at once";
      } catch (const std::logic_error& e) {
        ADD_FAILURE() << p << " stages, " << m << " micro-batches: the schedule cannot run: " << e.what();
      }
      EXPECT_EQ(schedule, parallel::one_f_one_b_schedule(p, m)) << p << " stages, " << m << " micro-batches";
    }
}

}  // namespace
}  // namespace course::testing
