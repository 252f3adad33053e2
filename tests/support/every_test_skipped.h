// The one outcome ctest reports as skipped: every test a run selected was skipped (GTEST_SKIP: no usable
// GPU here) and none failed. GoogleTest prints "[  SKIPPED ]" for each skipped test, and ctest's
// SKIP_REGULAR_EXPRESSION wins over a failure, so matching that line showed a run where one test
// skipped and another failed as skipped, its failure hidden. The run says so in a line of its own instead,
// COURSE_EVERY_TEST_SKIPPED (tests/CMakeLists.txt, which matches it), only when nothing failed or passed.
#pragma once
#include <gtest/gtest.h>

#include <cstdio>

namespace course::testing {

inline bool every_test_skipped() {
  const ::testing::UnitTest& run = *::testing::UnitTest::GetInstance();
  return run.failed_test_count() == 0 && run.successful_test_count() == 0 && run.skipped_test_count() > 0;
}

inline void say_every_test_skipped() {
  std::printf("%s\n", COURSE_EVERY_TEST_SKIPPED);
  std::fflush(stdout);
}

}  // namespace course::testing
