// A GoogleTest executable whose tests skip, pass and fail on purpose, for every_test_skipped_test: not a
// test of the course itself (tests/CMakeLists.txt registers none of it with ctest).
#include <gtest/gtest.h>

TEST(Helper, Skips) { GTEST_SKIP() << "on purpose"; }
TEST(Helper, Passes) { SUCCEED(); }
TEST(Helper, Fails) { ADD_FAILURE() << "on purpose"; }
