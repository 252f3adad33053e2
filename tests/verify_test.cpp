// The early-step check of a run's losses (common/verify/compare.h): rounding-level differences pass, a
// difference from the first steps fails however large the reference's floor grows later, and a
// difference once the noise has grown is left to the whole run's Drift.
#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>
#include <vector>

#include "common/verify/compare.h"

namespace course::testing {
namespace {

constexpr double kPerStep = 3e-6;  // 1e-3 x lr at lr 3e-3, as chapters 07 and 08 use

// A reference whose reordered run agrees exactly for 5 steps, then drifts by 1e-3 growing x10 a step.
std::vector<float> reference() { return std::vector<float>(10, 2.0f); }
std::vector<float> reordered() {
  std::vector<float> r = reference();
  for (std::size_t i = 5; i < r.size(); ++i) r[i] += 1e-3f * static_cast<float>(i - 4);
  return r;
}

TEST(EarlySteps, RoundingLevelDifferencesPass) {
  std::vector<float> run = reference();
  run[0] = std::nextafter(2.0f, 3.0f);  // one ulp
  run[3] = std::nextafter(2.0f, 1.0f);
  const auto early = verify::check_early_steps(run, reference(), reordered(), kPerStep);
  EXPECT_EQ(early.checked, 5u);  // steps 0-4; at step 5 the floor is 1e-3, 100 x it beyond any tolerance
  EXPECT_TRUE(early.passed()) << early.difference << " at step " << early.worst_step;
}

TEST(EarlySteps, AFaultFromTheFirstStepsFails) {
  std::vector<float> run = reference();
  for (std::size_t i = 1; i < run.size(); ++i) run[i] += 0.02f;  // a skipped average shows at step 1
  const auto early = verify::check_early_steps(run, reference(), reordered(), kPerStep);
  EXPECT_FALSE(early.passed());
  EXPECT_EQ(early.worst_step, 1u);  // the first, where the tolerance is tightest
  EXPECT_NEAR(early.difference, 0.02, 1e-6);
}

TEST(EarlySteps, LateDifferencesAreLeftToTheWholeRun) {
  std::vector<float> run = reordered();
  for (std::size_t i = 6; i < run.size(); ++i) run[i] += 0.5f;  // after the noise has grown
  EXPECT_TRUE(verify::check_early_steps(run, reference(), reordered(), kPerStep).passed());
}

TEST(EarlySteps, AResumedRunIsComparedFromItsFirstStep) {
  const std::vector<float> whole = reference();
  std::vector<float> run(whole.begin() + 2, whole.end());  // steps 2-9
  run[1] += 0.02f;                                                      // step 3
  const auto early = verify::check_early_steps(run, reference(), reordered(), kPerStep, 2);
  EXPECT_EQ(early.checked, 3u);  // steps 2, 3, 4
  EXPECT_FALSE(early.passed());
  EXPECT_EQ(early.worst_step, 3u);
  EXPECT_THROW(verify::check_early_steps(run, reference(), reordered(), kPerStep, 3), std::invalid_argument);
}

}  // namespace
}  // namespace course::testing
