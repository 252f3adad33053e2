// Context parallelism under mpirun with 1 to 4 ranks (the whole world is one context-parallel group):
// each rank holds its shard of a sequence's packed q, k and v, and Ulysses' all-to-alls and the ring's
// blocks give it its tokens of the whole sequence's causal attention, forward and every gradient.
// Ulysses runs the same kernel on the same heads, so it is the whole attention bit for bit; the ring's
// online softmax adds the blocks in another order, within its derived bound. The balanced layout gives
// every rank the same causal work, and each method hands the group the bytes its formula says.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/autograd/autograd.h"
#include "common/core/errors.h"
#include "common/ops/ops.h"
#include "common/faults/faults.h"
#include "common/parallel/context_parallel.h"
#include "common/verify/compare.h"
#include "support/mpi_main.h"

namespace course::testing {
namespace {

// The ring's online softmax against the whole attention's one softmax. A row's output is a sum of at
// most T weighted values either way; the ring rescales its running sums once per block (2N blocks at
// most, each factor exp_f32 within 2 ulp) and divides once at the end, the whole attention normalises
// each probability first. Each side is within (T + 4N + 4) u of the exact row relative to the largest
// value it weighs (Higham's bound for a sum of T terms, plus the rescalings), so the two are within
// twice that; the gradients are sums of the same kind over T keys or queries, of products of two such
// factors: 4 (T + 4N + 4) u of the largest entry. A missing block is off by whole terms (about 1/N of a row).
double ring_bound(std::int64_t t, int n) { return 4.0 * static_cast<double>(t + 4 * n + 4) * verify::kUnitRoundoff; }

constexpr std::int64_t kBatch = 2;

struct Case {
  std::int64_t t, heads, head_size;
};

// This rank's rows of the whole [B, T, W] tensor: the tokens at `positions`, in that order.
std::vector<float> rows_at(const std::vector<float>& whole, std::int64_t t, std::int64_t width,
                           const std::vector<std::int64_t>& positions) {
  std::vector<float> out;
  for (std::int64_t b = 0; b < kBatch; ++b)
    for (const std::int64_t p : positions)
      for (std::int64_t k = 0; k < width; ++k) out.push_back(whole[static_cast<std::size_t>((b * t + p) * width + k)]);
  return out;
}

struct Outcome {
  std::vector<float> y, grad;           // this rank's: the sharded attention's output and qkv gradient
  std::vector<float> whole_y, whole_grad;  // the whole attention's, at this rank's tokens
};

// The whole sequence's attention on every rank, and this rank's shard through `cp`, both backward from
// sum(y * w) with the same w.
Outcome run(const parallel::ContextParallel& cp, const Case& c) {
  const std::int64_t width = c.heads * c.head_size;
  Tensor qkv = Tensor::randn({kBatch, c.t, 3 * width}, 11);
  Tensor w = Tensor::randn({kBatch, c.t, width}, 12);
  Tensor whole = qkv.clone().set_requires_grad(true);
  Tensor whole_y = scaled_dot_product_attention(whole, c.heads);
  sum(mul(whole_y, w)).backward();
  const auto mine = cp.positions(c.t);
  const auto shard_len = static_cast<std::int64_t>(mine.size());
  Tensor shard = Tensor::from_host(rows_at(qkv.to_host(), c.t, 3 * width, mine), {kBatch, shard_len, 3 * width})
                     .set_requires_grad(true);
  Tensor y = cp.attention(shard, c.heads);
  sum(mul(y, Tensor::from_host(rows_at(w.to_host(), c.t, width, mine), {kBatch, shard_len, width}))).backward();
  return {y.to_host(), shard.grad().to_host(), rows_at(whole_y.to_host(), c.t, width, mine),
          rows_at(whole.grad().to_host(), c.t, 3 * width, mine)};
}

double largest(const std::vector<float>& v) {
  double m = 0;
  for (float x : v) m = std::max(m, static_cast<double>(std::fabs(x)));
  return m;
}

// The largest difference over the largest entry of the whole's (0 when bit-identical).
double relative_difference(const std::vector<float>& got, const std::vector<float>& expected) {
  EXPECT_EQ(got.size(), expected.size());
  double worst = 0;
  for (std::size_t i = 0; i < std::min(got.size(), expected.size()); ++i)
    worst = std::max(worst, std::fabs(static_cast<double>(got[i]) - expected[i]));
  return worst / std::max(largest(expected), 1e-30);
}

// Every rank's verdict, so that one rank's failure fails all (and a rank's pass is not the job's).
bool everywhere(bool mine) {
  Tensor flag = Tensor::from_host({mine ? 0.0f : 1.0f}, {1});
  world().all_reduce(flag, comm::ReduceOp::sum);
  return flag.item() == 0.0f;
}

TEST(ContextParallel, UlyssesIsTheWholeAttentionBitForBit) {
  // 12 heads divide among 1 to 4 ranks, 12 tokens too.
  parallel::ContextParallel cp(world(), parallel::ContextMethod::ulysses);
  const Outcome o = run(cp, {12, 12, 4});
  const bool same = o.y.size() == o.whole_y.size() && o.grad.size() == o.whole_grad.size() &&
                    std::memcmp(o.y.data(), o.whole_y.data(), o.y.size() * sizeof(float)) == 0 &&
                    std::memcmp(o.grad.data(), o.whole_grad.data(), o.grad.size() * sizeof(float)) == 0;
  EXPECT_TRUE(everywhere(same)) << "output off by " << relative_difference(o.y, o.whole_y) << ", gradient by "
                                << relative_difference(o.grad, o.whole_grad);
}

TEST(ContextParallel, RingIsTheWholeAttentionWithinTheOnlineSoftmaxsRounding) {
  parallel::ContextParallel cp(world(), parallel::ContextMethod::ring);
  for (const Case c : {Case{24, 2, 8}, Case{48, 3, 4}, Case{8 * world().size(), 1, 16}}) {
    const Outcome o = run(cp, c);
    const double bound = ring_bound(c.t, world().size());
    const double dy = relative_difference(o.y, o.whole_y), dg = relative_difference(o.grad, o.whole_grad);
    EXPECT_LE(dy, bound / 2) << "output, T " << c.t;
    EXPECT_LE(dg, bound) << "gradient of q, k and v, T " << c.t;
    EXPECT_TRUE(everywhere(dy <= bound / 2 && dg <= bound));
  }
}

// At one rank the whole sequence is the first tokens: the fault changes nothing, and must not.
TEST(ContextParallel, ARingThatForgetsTheShardsOffsetIsCaught) {
  parallel::ContextParallel cp(world(), parallel::ContextMethod::ring);
  const faults::Armed armed("skip-cp-offset");
  faults::Installation on_this;
  on_this.place(&cp);  // this object's tokens only: `right` below keeps its offset
  const Case c{24, 2, 8};
  // The fault changes which tokens each rank takes as well: compare with the whole at the true tokens.
  parallel::ContextParallel right(world(), parallel::ContextMethod::ring);
  const std::int64_t width = c.heads * c.head_size;
  Tensor qkv = Tensor::randn({kBatch, c.t, 3 * width}, 11);
  const auto mine = right.positions(c.t);
  Tensor shard = Tensor::from_host(rows_at(qkv.to_host(), c.t, 3 * width, mine),
                                   {kBatch, static_cast<std::int64_t>(mine.size()), 3 * width});
  const auto expected = rows_at(scaled_dot_product_attention(qkv, c.heads).to_host(), c.t, width, mine);
  const double off = relative_difference(cp.attention(shard, c.heads).to_host(), expected);
  // Some rank's queries now see keys their causal mask should hide, or miss ones it should show.
  EXPECT_EQ(everywhere(off <= ring_bound(c.t, world().size())), world().size() == 1) << off;
}

TEST(ContextParallel, TheBalancedLayoutGivesEveryRankTheSameCausalWork) {
  const int n = world().size();
  for (const auto method : {parallel::ContextMethod::ring, parallel::ContextMethod::ulysses}) {
    parallel::ContextParallel cp(world(), method);
    const std::int64_t t = 8 * n;
    std::vector<std::int64_t> all;
    std::vector<std::int64_t> pairs;  // visible (query, key) pairs of each rank's queries
    for (int r = 0; r < n; ++r) {
      const auto p = cp.positions(t, r);
      EXPECT_EQ(static_cast<std::int64_t>(p.size()), t / n);
      all.insert(all.end(), p.begin(), p.end());
      std::int64_t visible = 0;
      for (const std::int64_t i : p) visible += i + 1;
      pairs.push_back(visible);
    }
    std::sort(all.begin(), all.end());
    for (std::int64_t i = 0; i < t; ++i) EXPECT_EQ(all[static_cast<std::size_t>(i)], i) << "every token once";
    if (method == parallel::ContextMethod::ring) {
      EXPECT_EQ(*std::min_element(pairs.begin(), pairs.end()), *std::max_element(pairs.begin(), pairs.end()));
    } else if (n > 1) {  // contiguous shards: the last rank's queries see the most keys
      EXPECT_LT(pairs.front(), pairs.back());
    }
  }
}

TEST(ContextParallel, ShardTakesThisRanksTokens) {
  parallel::ContextParallel cp(world(), parallel::ContextMethod::ring);
  const std::int64_t t = 4 * world().size();
  std::vector<float> ids(static_cast<std::size_t>(kBatch * t));
  for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<float>(i);
  const auto got = cp.shard(Tensor::from_host(ids, {kBatch, t})).to_host();
  const auto mine = cp.positions(t);
  ASSERT_EQ(got.size(), static_cast<std::size_t>(kBatch) * mine.size());
  for (std::int64_t b = 0; b < kBatch; ++b)
    for (std::size_t k = 0; k < mine.size(); ++k)
      EXPECT_EQ(got[static_cast<std::size_t>(b) * mine.size() + k], static_cast<float>(b * t + mine[k]));
}

TEST(ContextParallel, EachMethodHandsTheGroupTheBytesOfItsFormula) {
  for (const auto method : {parallel::ContextMethod::ulysses, parallel::ContextMethod::ring}) {
    parallel::ContextParallel cp(world(), method);
    const Case c{24, 12, 2};
    const std::int64_t before = world().bytes_sent();
    run(cp, c);
    const std::int64_t sent = world().bytes_sent() - before;
    EXPECT_EQ(sent, cp.bytes_per_attention(kBatch, c.t, c.heads * c.head_size, 4))
        << parallel::context_method_name(method);
    EXPECT_EQ(cp.bytes_sent(), sent) << "the object's own count";
  }
}

TEST(ContextParallel, BadShapesAreRefusedNamingTheFlag) {
  parallel::ContextParallel ulysses(world(), parallel::ContextMethod::ulysses);
  parallel::ContextParallel ring(world(), parallel::ContextMethod::ring);
  EXPECT_THROW(parallel::parse_context_method("tree"), UsageError);
  const int n = world().size();
  if (n == 1) {  // one rank splits nothing: any sequence and any heads
    EXPECT_NO_THROW(ring.check(7, 3));
    EXPECT_NO_THROW(ulysses.check(7, 3));
    return;
  }
  try {
    ulysses.check(4 * n, 4 * n + 1);  // heads that do not divide
    ADD_FAILURE() << "indivisible heads accepted";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("--cp"), std::string::npos) << e.what();
  }
  EXPECT_THROW(ring.check(2 * n + 1, 1), UsageError);
  EXPECT_THROW(ring.check(3 * n, 1), UsageError);  // divides by N, not into the ring's 2N chunks
  EXPECT_NO_THROW(ring.check(2 * n, 1));
}

}  // namespace
}  // namespace course::testing

COURSE_MPI_TEST_MAIN()
