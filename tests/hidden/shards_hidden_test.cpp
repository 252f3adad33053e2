// Exercise 07.1's hidden graded tests (run by `exercises.py grade`, kept out of the participant's copy):
// layouts of up to 16 ranks and parameters of thousands of elements, against the library's pieces.
#include <gtest/gtest.h>

#include <random>
#include <tuple>

#include "07_zero/shards.h"

namespace course::testing {
namespace {

TEST(Hidden07, PiecesMatchTheLibrarysAtUpToSixteenRanks) {
  std::mt19937_64 random(707);
  for (int trial = 0; trial < 150; ++trial) {
    std::vector<Tensor> params;
    for (std::size_t i = 0, n = 1 + random() % 12; i < n; ++i)
      params.push_back(Tensor::zeros({static_cast<std::int64_t>(random() % 3 == 0 ? random() % 5 : random() % 5000)}));
    const int ranks = 1 + static_cast<int>(random() % 16);
    const parallel::FlatLayout layout(params, ranks, 1 + static_cast<std::int64_t>(random() % 9000));
    for (std::size_t u = 0; u < layout.units().size(); ++u) {
      const parallel::FlatUnit& unit = layout.units()[u];
      std::vector<std::int64_t> numels;
      for (std::size_t p : unit.params) numels.push_back(layout.numel_of(p));
      for (int r = 0; r < ranks; ++r) {
        std::vector<std::tuple<std::size_t, std::int64_t, std::int64_t, std::int64_t>> mine, library;
        for (const auto& s : chapter07::owned_segments(numels, unit.part, r))
          mine.emplace_back(s.param < unit.params.size() ? unit.params[s.param] : s.param, s.param_offset, s.part_offset,
                            s.length);
        for (const auto& s : layout.segments(u, r)) library.emplace_back(s.param, s.param_offset, s.part_offset, s.length);
        EXPECT_EQ(mine, library) << "trial " << trial << ": " << ranks << " ranks, unit " << u << ", rank " << r;
      }
    }
  }
}

}  // namespace
}  // namespace course::testing
