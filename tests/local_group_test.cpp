// The in-process group (verify/local_group.h): its collectives between threads, float32 sums in rank
// order and 16-bit ones in the ring's, with the MPI backend's roundings (comm_test checks them against MPI
// itself at 2 to 4 ranks), one member computing at a time, and errors that end the run instead of hanging it.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <memory>
#include <stdexcept>

#include "common/verify/local_group.h"

namespace course::testing {
namespace {

using comm::ReduceOp;

Tensor values(const std::vector<float>& v, DType dtype = DType::float32) {
  return Tensor::from_host(v, {static_cast<std::int64_t>(v.size())}, Device::cpu, dtype);
}

// bfloat16 keeps 8 significant bits: 1 + 2^-8 is a tie that rounds to 1, 1 + 2^-7 is exact.
// 16-bit sums go in the ring's order (the MPI backend's): one value is chunk 0, added from member 1,
// then member 2, then member 0, each partial sum rounded to 8 bits.
TEST(LocalGroup, SixteenBitSumsRoundAfterEachAdditionInTheRingsOrder) {
  verify::LocalGroup group(3);
  const float tiny = std::ldexp(1.0f, -8);
  for (const int big : {1, 0}) {
    std::vector<std::vector<float>> got(3);
    group.run([&](comm::Communicator& c) {
      Tensor t = values({c.rank() == big ? 1.0f : tiny}, DType::bfloat16);
      c.all_reduce(t, ReduceOp::sum);
      got[static_cast<std::size_t>(c.rank())] = t.to_host();
    });
    // Member 1 first: (1 + 2^-8) rounds to 1, and so does 1 + 2^-8 again. Member 0 last: the two small
    // ones meet first, 2^-7, and 1 + 2^-7 is a bfloat16.
    const float expected = big == 1 ? 1.0f : 1.0f + 2 * tiny;
    for (const auto& v : got) EXPECT_EQ(v, std::vector<float>{expected}) << "1 at member " << big;
  }
}

TEST(LocalGroup, ReductionsMatchTheirDefinitions) {
  verify::LocalGroup group(3);
  std::vector<std::vector<float>> sum(3), average(3), maximum(3), half_average(3), reduced(3);
  group.run([&](comm::Communicator& c) {
    const auto r = static_cast<float>(c.rank());
    const auto me = static_cast<std::size_t>(c.rank());
    Tensor s = values({r + 0.1f, -r}), a = values({r + 0.1f, 3.0f}), m = values({-r, r * r - 2 * r});
    Tensor h = values({r + 1.0f}, DType::float16), root = values({r + 1.0f});
    c.all_reduce(s, ReduceOp::sum);
    c.all_reduce(a, ReduceOp::average);
    c.all_reduce(m, ReduceOp::max);
    c.all_reduce(h, ReduceOp::average);
    c.reduce(root, 1, ReduceOp::sum);
    sum[me] = s.to_host(), average[me] = a.to_host(), maximum[me] = m.to_host(), half_average[me] = h.to_host();
    reduced[me] = root.to_host();
  });
  // float32 in the ring's order too: the first value is chunk 0's, added from member 1 round to member 0
  // (in rank order it would be 3.29999995, one rounding above).
  const float s0 = (1.1f + 2.1f) + 0.1f;
  for (std::size_t k = 0; k < 3; ++k) {
    EXPECT_EQ(sum[k], (std::vector<float>{s0, -3.0f}));
    EXPECT_EQ(average[k], (std::vector<float>{s0 * (1.0f / 3.0f), 9.0f * (1.0f / 3.0f)}));
    EXPECT_EQ(maximum[k], (std::vector<float>{0.0f, 0.0f}));
    // float16: each value times 1/3 rounded to 11 bits before the sum, as the MPI backend premultiplies,
    // then added in the ring's order (members 1, 2, 0 for the one value).
    const auto third = [](float v) { return values({v * (1.0f / 3.0f)}, DType::float16).to_host()[0]; };
    const float partial = values({third(2) + third(3)}, DType::float16).to_host()[0];
    EXPECT_EQ(half_average[k], std::vector<float>{values({partial + third(1)}, DType::float16).to_host()[0]});
  }
  EXPECT_EQ(reduced[1], std::vector<float>{6.0f});  // the root holds the sum
  EXPECT_EQ(reduced[0], std::vector<float>{1.0f});  // the others keep their input
  EXPECT_EQ(reduced[2], std::vector<float>{3.0f});
}

TEST(LocalGroup, DataMovesAsMpiMovesIt) {
  verify::LocalGroup group(3);
  std::vector<std::vector<float>> gathered(3), scattered(3), broadcast(3), exchanged(3), ring(3);
  group.run([&](comm::Communicator& c) {
    const int r = c.rank(), n = c.size();
    const auto me = static_cast<std::size_t>(r);
    Tensor mine = values({10.0f * r, 10.0f * r + 1});
    Tensor all = Tensor::zeros({2 * n});
    c.all_gather(mine, all);
    Tensor pieces = values({1.0f * r, 2.0f * r, 3.0f * r}), piece = Tensor::zeros({1});
    c.reduce_scatter(pieces, piece, ReduceOp::sum);
    Tensor b = values({static_cast<float>(r)});
    c.broadcast(b, 2);
    Tensor slices = values({100.0f * r, 100.0f * r + 1, 100.0f * r + 2}), swapped = Tensor::zeros({3});
    c.all_to_all(slices, swapped);
    Tensor received = Tensor::zeros({1});
    c.send_recv(values({static_cast<float>(r)}), (r + 1) % n, received, (r + n - 1) % n);
    c.barrier();
    gathered[me] = all.to_host(), scattered[me] = piece.to_host(), broadcast[me] = b.to_host();
    exchanged[me] = swapped.to_host(), ring[me] = received.to_host();
  });
  for (std::size_t k = 0; k < 3; ++k) {
    const auto r = static_cast<float>(k);
    EXPECT_EQ(gathered[k], (std::vector<float>{0, 1, 10, 11, 20, 21}));
    EXPECT_EQ(scattered[k], std::vector<float>{(r + 1) * 3.0f});  // element k: (k + 1) x (0 + 1 + 2)
    EXPECT_EQ(broadcast[k], std::vector<float>{2.0f});
    EXPECT_EQ(exchanged[k], (std::vector<float>{r, 100 + r, 200 + r}));  // slice k of every member
    EXPECT_EQ(ring[k], std::vector<float>{static_cast<float>((k + 2) % 3)});
  }
}

TEST(LocalGroup, OneMemberComputesAtATime) {
  verify::LocalGroup group(4);
  std::atomic<int> running{0}, most{0};
  const auto busy = [&] {
    most = std::max(most.load(), ++running);
    volatile double x = 0;
    for (int i = 0; i < 200000; ++i) x = x + std::sqrt(static_cast<double>(i));
    --running;
  };
  group.run([&](comm::Communicator& c) {
    for (int round = 0; round < 5; ++round) {
      busy();
      Tensor t = values({1.0f});
      c.all_reduce(t);
    }
    busy();
  });
  EXPECT_EQ(most.load(), 1);
}

// A 2 x 2 grid of threads, each a member of a row group and a column group that share the turns (as a
// TP rank is of its TP and CP groups): sums along rows and columns, and a wait no thread can answer
// ends the run instead of hanging it.
TEST(LocalGroup, ThreadsBelongToSeveralGroupsOfOneRun) {
  const auto turns = verify::make_turns();
  std::vector<std::unique_ptr<verify::LocalGroup>> rows, columns;
  for (int i = 0; i < 2; ++i) {
    rows.push_back(std::make_unique<verify::LocalGroup>(2, turns));
    columns.push_back(std::make_unique<verify::LocalGroup>(2, turns));
  }
  std::vector<float> row_sums(4), column_sums(4);
  verify::run_in_turns(*turns, 4, [&](int k) {
    const int row = k / 2, column = k % 2;
    Tensor r = values({static_cast<float>(k)}), c = values({static_cast<float>(k)});
    rows[static_cast<std::size_t>(row)]->member(column).all_reduce(r);
    columns[static_cast<std::size_t>(column)]->member(row).all_reduce(c);
    row_sums[static_cast<std::size_t>(k)] = r.item(), column_sums[static_cast<std::size_t>(k)] = c.item();
  });
  EXPECT_EQ(row_sums, (std::vector<float>{1, 1, 5, 5}));     // 0 + 1, 2 + 3
  EXPECT_EQ(column_sums, (std::vector<float>{2, 4, 2, 4}));  // 0 + 2, 1 + 3
  // Thread 3 skips its row's sum: thread 2 waits for it, thread 3 for its column, whose other member
  // (thread 1) is done.
  EXPECT_THROW(verify::run_in_turns(*turns, 4, [&](int k) {
                 const int row = k / 2, column = k % 2;
                 Tensor t = values({1.0f});
                 if (k == 1) return;
                 if (k != 3) rows[static_cast<std::size_t>(row)]->member(column).all_reduce(t);
                 if (k == 3) columns[static_cast<std::size_t>(column)]->member(row).all_reduce(t);
               }),
               std::logic_error);
  // A group made with other turns cannot be used from this run's threads.
  verify::LocalGroup other(1);
  EXPECT_THROW(verify::run_in_turns(*turns, 1, [&](int) {
                 Tensor t = values({1.0f});
                 other.member(0).all_reduce(t);
               }),
               std::logic_error);
}

TEST(LocalGroup, ErrorsEndTheRunWithTheFailingMembersError) {
  verify::LocalGroup group(3);
  // A member that throws: the others stop waiting at their collective, and its error is the one raised.
  EXPECT_THROW(group.run([](comm::Communicator& c) {
                 if (c.rank() == 1) throw std::domain_error("member 1 failed");
                 Tensor t = values({1.0f});
                 c.all_reduce(t);
               }),
               std::domain_error);
  // Members calling different collectives.
  try {
    group.run([](comm::Communicator& c) {
      Tensor t = values({1.0f});
      if (c.rank() == 2) c.broadcast(t, 0); else c.all_reduce(t);
    });
    ADD_FAILURE() << "mismatched collectives ran";
  } catch (const std::logic_error& e) {
    EXPECT_NE(std::string(e.what()).find("member 2 called broadcast while member 0 called all_reduce"), std::string::npos)
        << e.what();
  }
  // A member that never comes: the others are told, not left waiting.
  EXPECT_THROW(group.run([](comm::Communicator& c) {
                 if (c.rank() == 0) return;
                 Tensor t = values({1.0f});
                 c.all_reduce(t);
               }),
               std::logic_error);
  // The group is whole again afterwards.
  std::vector<float> after(3);
  group.run([&](comm::Communicator& c) {
    Tensor t = values({1.0f});
    c.all_reduce(t);
    after[static_cast<std::size_t>(c.rank())] = t.item();
  });
  EXPECT_EQ(after, (std::vector<float>{3, 3, 3}));
  // Outside run(), and lone point-to-point calls.
  Tensor t = values({1.0f});
  EXPECT_THROW(group.member(0).all_reduce(t), std::logic_error);
  EXPECT_THROW(group.run([](comm::Communicator& c) {
                 Tensor x = values({1.0f});
                 c.send(x, (c.rank() + 1) % 3);
               }),
               std::logic_error);
}

}  // namespace
}  // namespace course::testing
