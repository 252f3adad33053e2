// Exercise 07.1, chapter 07's shards (07_zero/shards.cpp): the pieces of a unit's parameters each rank
// owns, by hand and against the library's FlatLayout::segments on random layouts at 1 to 8 ranks.
#include <gtest/gtest.h>

#include <random>
#include <tuple>

#include "07_zero/shards.h"

namespace course::testing {
namespace {

using Piece = std::tuple<std::size_t, std::int64_t, std::int64_t, std::int64_t>;  // param, in it, in the part, length
std::vector<Piece> pieces(const std::vector<parallel::FlatSegment>& segments) {
  std::vector<Piece> out;
  for (const auto& s : segments) out.emplace_back(s.param, s.param_offset, s.part_offset, s.length);
  return out;
}

// Parameters of 5, 3 and 6 elements over 3 ranks: 14 elements padded to 15, parts of 5. Rank 0 owns the
// first parameter; rank 1 the second and the third's first 2 elements; rank 2 the third's last 4, then padding.
TEST(Exercise07, PiecesOfThreeParametersOverThreeRanks) {
  const std::vector<std::int64_t> numels{5, 3, 6};
  EXPECT_EQ(pieces(chapter07::owned_segments(numels, 5, 0)), (std::vector<Piece>{{0, 0, 0, 5}}));
  EXPECT_EQ(pieces(chapter07::owned_segments(numels, 5, 1)), (std::vector<Piece>{{1, 0, 0, 3}, {2, 0, 3, 2}}));
  EXPECT_EQ(pieces(chapter07::owned_segments(numels, 5, 2)), (std::vector<Piece>{{2, 2, 0, 4}}));
}

// A parameter longer than a part is cut across ranks; a rank whose part is all padding owns nothing.
TEST(Exercise07, AParameterCutAcrossRanksAndAPartOfPaddingOnly) {
  const std::vector<std::int64_t> numels{9};  // 4 ranks: padded to 12, parts of 3
  EXPECT_EQ(pieces(chapter07::owned_segments(numels, 3, 1)), (std::vector<Piece>{{0, 3, 0, 3}}));
  EXPECT_EQ(pieces(chapter07::owned_segments(numels, 3, 3)), std::vector<Piece>{});
  EXPECT_EQ(pieces(chapter07::owned_segments({0, 2}, 2, 0)), (std::vector<Piece>{{1, 0, 0, 2}}))
      << "an empty parameter has no piece";
}

// Random layouts: exactly the library's pieces, and together the ranks own every element once.
TEST(Exercise07, PiecesMatchTheLibrarysOnRandomLayouts) {
  std::mt19937_64 random(7);
  for (int trial = 0; trial < 300; ++trial) {
    std::vector<Tensor> params;
    for (std::size_t i = 0, n = 1 + random() % 6; i < n; ++i)
      params.push_back(Tensor::zeros({static_cast<std::int64_t>(random() % 40)}));
    const int ranks = 1 + static_cast<int>(random() % 8);
    const parallel::FlatLayout layout(params, ranks, 1 + static_cast<std::int64_t>(random() % 60));
    for (std::size_t u = 0; u < layout.units().size(); ++u) {
      const parallel::FlatUnit& unit = layout.units()[u];
      std::vector<std::int64_t> numels, owned(unit.params.size(), 0);
      for (std::size_t p : unit.params) numels.push_back(layout.numel_of(p));
      for (int r = 0; r < ranks; ++r) {
        auto mine = chapter07::owned_segments(numels, unit.part, r);
        for (auto& s : mine) {
          if (s.param < owned.size()) owned[s.param] += s.length;
          s.param = s.param < unit.params.size() ? unit.params[s.param] : s.param;
        }
        EXPECT_EQ(pieces(mine), pieces(layout.segments(u, r))) << "trial " << trial << ", unit " << u << ", rank " << r;
      }
      EXPECT_EQ(owned, numels) << "trial " << trial << ": the ranks together must own every element once";
    }
  }
}

}  // namespace
}  // namespace course::testing
