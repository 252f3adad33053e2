// The CLI helpers: byte sizes with suffixes, checked against overflow and limits; integer flags read
// in decimal whatever their leading zeros, and never in another base; --tf32 only where there is a GPU.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "common/cli/cli.h"
#include "common/cli/precision_options.h"
#include "common/core/errors.h"
#include "common/core/exercise.h"
#include "common/kernels/kernels.h"

namespace course {
namespace {

// The participant's copy reaches an exercise not written yet: one line naming it, where it lives and its
// handout, and the exit code of its own (3), whatever the inputs handed to the stub.
TEST(Exercise, NotDoneSaysWhichOnOneLineAndExitsWithItsCode) {
  EXPECT_EXIT(course::exercise::not_done("02.1", "one step's gradient", "02_grad_accumulation/main.cpp:77",
                                         "02_grad_accumulation/README.md#exercises", 1, std::string("inputs")),
              ::testing::ExitedWithCode(course::exercise::kNotDone),
              "^exercise 02\\.1 \\(one step's gradient, 02_grad_accumulation/main\\.cpp:77\\) is not done yet; see "
              "02_grad_accumulation/README\\.md#exercises\n$");
}

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

// Parses `--n text` through cli::run; returns the exit code and the value read.
std::pair<int, std::int64_t> parse_n(const std::string& text) {
  CLI::App app;
  std::int64_t n = -1;
  app.add_option("--n", n);
  std::vector<std::string> words{"program", "--n", text};
  std::vector<char*> argv;
  for (auto& w : words) argv.push_back(w.data());
  const int code = cli::run(app, static_cast<int>(argv.size()), argv.data(), [] { return 0; });
  return {code, n};
}

TEST(IntegerFlags, AreDecimalWhateverTheirLeadingZeros) {
  for (const auto& [text, expected] : std::vector<std::pair<std::string, std::int64_t>>{
           {"10", 10}, {"010", 10}, {"0007", 7}, {"0", 0}, {"000", 0}, {"-012", -12}, {"+08", 8}}) {
    const auto [code, n] = parse_n(text);
    EXPECT_EQ(code, 0) << text;
    EXPECT_EQ(n, expected) << text;
  }
  for (const char* other_base : {"0x10", "0X1f", "0b11", "0o7", "-0x3"}) EXPECT_EQ(parse_n(other_base).first, 2) << other_base;
}

// Floating-point flags too are decimal: C's hexadecimal forms, which strtod reads, are refused.
TEST(FloatFlags, AreDecimalNotHexadecimal) {
  for (const char* decimal : {"16", "1.5", ".5", "2.", "1e-3", "+3E2", "0.001"}) EXPECT_TRUE(cli::decimal_number(decimal)) << decimal;
  for (const char* other : {"0x10", "0X1p4", "0x1p16", "1e", "e5", ".", "1.2.3", "inf", "nan", " 1", ""})
    EXPECT_FALSE(cli::decimal_number(other)) << other;
  CLI::App app;
  double clip = 0;
  app.add_option("--clip", clip)->check(cli::NonNegativeFinite);
  for (const auto& [text, code] : std::vector<std::pair<std::string, int>>{{"0x10", 2}, {"16", 0}, {"1e1", 0}}) {
    std::vector<std::string> words{"test", "--clip", text};
    std::vector<char*> argv;
    for (auto& w : words) argv.push_back(w.data());
    EXPECT_EQ(cli::run(app, static_cast<int>(argv.size()), argv.data(), [] { return 0; }), code) << text;
  }
}

}  // namespace
// --tf32 is a GPU format: refused on the CPU with one line naming the flag, TF32 left off; without the
// flag nothing is allowed on either device.
TEST(PrecisionFlags, Tf32IsForTheGpuOnly) {
  cli::PrecisionOptions options;
  options.tf32 = true;
  try {
    cli::apply_precision(options, Device::cpu);
    ADD_FAILURE() << "--tf32 on the CPU was accepted";
  } catch (const UsageError& e) {
    EXPECT_EQ(std::string(e.what()).rfind("--tf32: ", 0), 0u) << e.what();
  }
  EXPECT_FALSE(allow_tf32());
  options.tf32 = false;
  cli::apply_precision(options, Device::cpu);
  EXPECT_FALSE(allow_tf32());
  EXPECT_EQ(cli::precision_description(options), "fp32");
  options.tf32 = true;
  EXPECT_EQ(cli::precision_description(options), "fp32, TF32 matrix products");
}

}  // namespace course
