// The CLI helpers: byte sizes with suffixes, checked against overflow and limits.
#include <gtest/gtest.h>

#include "common/cli/cli.h"
#include "common/core/errors.h"

namespace course {
namespace {

TEST(ParseBytes, ReadsSuffixes) {
  EXPECT_EQ(cli::parse_bytes("8", "-b"), 8u);
  EXPECT_EQ(cli::parse_bytes("1K", "-b"), 1024u);
  EXPECT_EQ(cli::parse_bytes("64M", "-b", 4), 64u << 20);
  EXPECT_EQ(cli::parse_bytes("2G", "-b", 4, std::size_t{1} << 32), std::size_t{2} << 30);
}

TEST(ParseBytes, RejectsWhatIsNotASizeNamingTheFlag) {
  for (const char* bad : {"", "0", "-1", "1X", "K", "1.5M", "12 M", "99999999999G", "9999999999999999999",
                          "6", "5G"}) {
    try {
      cli::parse_bytes(bad, "-e", 4, std::size_t{1} << 32);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const UsageError& e) {
      EXPECT_EQ(std::string(e.what()).rfind("-e: ", 0), 0u) << e.what();
    }
  }
}

}  // namespace
}  // namespace course
