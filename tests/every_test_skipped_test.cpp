// What ctest is told about a run with skips (support/every_test_skipped.h): the line that makes it report
// the run as skipped comes only when every test the run selected was skipped; a skip beside a failure
// leaves the failure a failure, and a skip beside a pass leaves the pass.
#include <gtest/gtest.h>

#include "support/process.h"

namespace course::testing {
namespace {

const std::string kHelper = SKIP_HELPER;
const std::string kLine = COURSE_EVERY_TEST_SKIPPED;

ProcessResult run(const std::string& filter) { return run_process(kHelper + " --gtest_filter=" + filter); }

TEST(EveryTestSkipped, IsSaidWhenEveryTestSkipped) {
  const auto r = run("Helper.Skips");
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find(kLine), std::string::npos) << r.out;
}

TEST(EveryTestSkipped, IsNotSaidBesideAFailure) {
  const auto r = run("Helper.Skips:Helper.Fails");
  EXPECT_NE(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("[  SKIPPED ]"), std::string::npos) << "GoogleTest's own line, which ctest matched before\n" << r.out;
  EXPECT_EQ(r.out.find(kLine), std::string::npos) << r.out;
}

TEST(EveryTestSkipped, IsNotSaidBesideAPass) {
  for (const char* filter : {"Helper.Skips:Helper.Passes", "Helper.Passes"}) {
    const auto r = run(filter);
    EXPECT_EQ(r.exit_code, 0) << filter << "\n" << r.out;
    EXPECT_EQ(r.out.find(kLine), std::string::npos) << filter << "\n" << r.out;
  }
}

}  // namespace
}  // namespace course::testing
