// main() for the course's GoogleTest executables (GoogleTest's own, and one line more): when every test
// the run selected was skipped and none failed, it says so, which ctest reports as skipped
// (every_test_skipped.h says why ctest cannot be left to read GoogleTest's own lines).
#include <gtest/gtest.h>

#include "support/every_test_skipped.h"

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  const int failed = RUN_ALL_TESTS();
  if (course::testing::every_test_skipped()) course::testing::say_every_test_skipped();
  return failed;
}
