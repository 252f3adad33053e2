// The communicator and the hand-written algorithms, under mpirun with 2, 3 and 4 ranks.
// Inputs are small integers in float, so every sum is exact and results are compared exactly.
#include <gtest/gtest.h>

#include <bit>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <thread>

#include "common/comm/agree.h"
#include "common/comm/algorithms.h"
#include "common/verify/local_group.h"
#include "common/comm/shared_ring.h"
#include "common/comm/simulated_network.h"
#include "common/core/errors.h"
#include "common/kernels/kernels.h"
#include "common/ops/ops.h"
#include "common/verify/compare.h"
#include "support/mpi_main.h"

namespace course::testing {
namespace {

namespace algo = comm::algorithms;
using comm::ReduceOp;

// Rank r's element i: (r + 1) * (i % 13 + 1). Sums over 4 ranks stay below 2^24, so they are exact.
float value(int rank, std::size_t i) { return static_cast<float>((rank + 1) * static_cast<int>(i % 13 + 1)); }

Tensor rank_tensor(std::size_t n, int rank) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = value(rank, i);
  return Tensor::from_host(v, {static_cast<std::int64_t>(n)});
}

std::vector<std::size_t> sizes() {
  int n = world().size();
  return {0, 1, static_cast<std::size_t>(n - 1), 1000003, 16u << 20};  // 16M elements = 64 MiB
}

// The large size costs seconds on an oversubscribed CPU; the all-reduce covers it, the rest stop below.
constexpr std::size_t kLargestForEveryAlgorithm = 1000003;

TEST(RingAllReduce, MatchesLibraryAllReduce) {
  for (std::size_t n : sizes())
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::max, ReduceOp::average}) {
      if (op != ReduceOp::sum && n > kLargestForEveryAlgorithm) continue;
      Tensor mine = rank_tensor(n, world().rank()), reference = mine.clone();
      algo::ring_all_reduce(world(), mine, op);
      world().all_reduce(reference, op);
      ASSERT_EQ(mine.to_host(), reference.to_host()) << "n=" << n << " op=" << comm::reduce_op_name(op);
    }
}

TEST(RingAllReduce, PipelinedSegmentsMatchLibraryAllReduce) {
  for (std::size_t segment : {std::size_t{1}, std::size_t{7}, algo::kRingSegment})
    for (std::size_t n : sizes()) {
      if (n > kLargestForEveryAlgorithm || (segment < 8 && n > 100000)) continue;  // one message per element is slow
      for (ReduceOp op : {ReduceOp::sum, ReduceOp::max}) {
        Tensor mine = rank_tensor(n, world().rank()), reference = mine.clone();
        algo::ring_all_reduce(world(), mine, op, segment);
        world().all_reduce(reference, op);
        ASSERT_EQ(mine.to_host(), reference.to_host()) << "n=" << n << " segment=" << segment;
      }
    }
}

TEST(RingAllReduce, SumIsTheClosedForm) {
  const int ranks = world().size();
  Tensor t = rank_tensor(1000, world().rank());
  algo::ring_all_reduce(world(), t, ReduceOp::sum);
  auto got = t.to_host();
  for (std::size_t i = 0; i < got.size(); ++i)
    ASSERT_EQ(got[i], static_cast<float>(ranks * (ranks + 1) / 2 * static_cast<int>(i % 13 + 1))) << i;
}

TEST(Broadcast, NaiveAndTreeMatchLibrary) {
  for (std::size_t n : sizes())
    for (int root : {0, world().size() - 1}) {
      Tensor expected = rank_tensor(n, world().rank());
      world().broadcast(expected, root);
      Tensor tree = rank_tensor(n, world().rank());
      algo::tree_broadcast(world(), tree, root);
      ASSERT_EQ(tree.to_host(), expected.to_host()) << "tree n=" << n << " root=" << root;
      if (n > kLargestForEveryAlgorithm) continue;
      Tensor naive = rank_tensor(n, world().rank());
      algo::naive_broadcast(world(), naive, root);
      ASSERT_EQ(naive.to_host(), expected.to_host()) << "naive n=" << n << " root=" << root;
    }
}

TEST(Reduce, NaiveAndTreeMatchLibraryOnTheRoot) {
  for (std::size_t n : sizes()) {
    if (n > kLargestForEveryAlgorithm) continue;
    for (int root : {0, world().size() - 1})
      for (ReduceOp op : {ReduceOp::sum, ReduceOp::max}) {
        Tensor expected = rank_tensor(n, world().rank());
        world().reduce(expected, root, op);
        Tensor tree = rank_tensor(n, world().rank()), naive = rank_tensor(n, world().rank());
        algo::tree_reduce(world(), tree, root, op);
        algo::naive_reduce(world(), naive, root, op);
        if (world().rank() == root) {
          ASSERT_EQ(tree.to_host(), expected.to_host()) << "tree n=" << n << " root=" << root;
          ASSERT_EQ(naive.to_host(), expected.to_host()) << "naive n=" << n << " root=" << root;
        }
      }
  }
}

TEST(RingAllGatherAndReduceScatter, MatchLibrary) {
  const auto ranks = static_cast<std::size_t>(world().size());
  for (std::size_t n : sizes()) {
    if (n > kLargestForEveryAlgorithm) continue;
    Tensor in = rank_tensor(n, world().rank());
    Tensor ring = Tensor::zeros({static_cast<std::int64_t>(n * ranks)}), lib = ring.clone();
    algo::ring_all_gather(world(), in, ring);
    world().all_gather(in, lib);
    ASSERT_EQ(ring.to_host(), lib.to_host()) << "all_gather n=" << n;

    Tensor big = rank_tensor(n * ranks, world().rank());
    Tensor ring_out = Tensor::zeros({static_cast<std::int64_t>(n)}), lib_out = ring_out.clone();
    algo::ring_reduce_scatter(world(), big, ring_out);
    world().reduce_scatter(big, lib_out);
    ASSERT_EQ(ring_out.to_host(), lib_out.to_host()) << "reduce_scatter n=" << n;
  }
}

TEST(Chunks, CoverTheCountWithoutGaps) {
  for (std::size_t count : {0ul, 1ul, 7ul, 1000003ul})
    for (int ranks : {1, 2, 3, 4, 7}) {
      std::size_t next = 0;
      for (int c = 0; c < ranks; ++c) {
        auto chunk = algo::chunk_of(count, ranks, c);
        ASSERT_EQ(chunk.begin, next);
        ASSERT_LE(chunk.size(), count / ranks + 1);
        next = chunk.end;
      }
      ASSERT_EQ(next, count);
    }
}

TEST(Communicator, ScatterGatherSendRecv) {
  const int ranks = world().size(), me = world().rank();
  Tensor all = rank_tensor(5 * static_cast<std::size_t>(ranks), 0), mine = Tensor::zeros({5});
  world().scatter(all, mine, 0);
  EXPECT_EQ(mine.to_host(), all.flat_view(5 * static_cast<std::size_t>(me), 5).to_host());
  Tensor gathered = Tensor::zeros({5 * ranks});
  world().gather(mine, gathered, 0);
  if (me == 0) {
    EXPECT_EQ(gathered.to_host(), all.to_host());
  }
  Tensor out = Tensor::full({3}, static_cast<float>(me)), in = Tensor::zeros({3});
  world().send_recv(out, (me + 1) % ranks, in, (me - 1 + ranks) % ranks);
  EXPECT_EQ(in.to_host(), std::vector<float>(3, static_cast<float>((me - 1 + ranks) % ranks)));
  world().barrier();
}

// All-to-all: slice j of rank r's input lands in slice r of rank j's output, for every pair, in float32
// and in 16 bits, through the simulated network too (a decorator forwards it); a size that does not
// split into equal slices is refused.
TEST(Communicator, AllToAllSendsEachRankItsSlice) {
  const int ranks = world().size(), me = world().rank();
  constexpr std::int64_t kSlice = 3;
  auto value_at = [ranks](int from, int to, std::int64_t k) {  // distinct, and below 256: exact in bfloat16
    return static_cast<float>((from * ranks + to) * kSlice + k);
  };
  std::vector<float> mine;
  for (int to = 0; to < ranks; ++to)
    for (std::int64_t k = 0; k < kSlice; ++k) mine.push_back(value_at(me, to, k));
  std::vector<float> expected;
  for (int from = 0; from < ranks; ++from)
    for (std::int64_t k = 0; k < kSlice; ++k) expected.push_back(value_at(from, me, k));
  const Tensor input = Tensor::from_host(mine, {ranks * kSlice});
  auto simulated = comm::simulate_network(world().split(0, me), comm::NetworkModel{1.0, 10.0});
  for (comm::Communicator* group : {&world(), simulated.get()})
    for (DType dtype : {DType::float32, DType::bfloat16}) {  // small integers: exact in bfloat16
      Tensor in = input.to(dtype), out = Tensor::zeros({ranks * kSlice}, Device::cpu, dtype);
      group->all_to_all(in, out);
      EXPECT_EQ(out.to(DType::float32).to_host(), expected) << group->backend_name() << " " << dtype_name(dtype);
    }
  if (ranks > 1) {
    Tensor odd = Tensor::zeros({ranks + 1}), out = Tensor::zeros({ranks + 1});
    EXPECT_THROW(world().all_to_all(odd, out), std::invalid_argument);
  }
}

TEST(Communicator, AsyncWorkRunsWhileTheCallerComputes) {
  std::vector<Tensor> tensors;
  std::vector<comm::WorkHandle> work;
  for (int k = 0; k < 4; ++k) {
    tensors.push_back(rank_tensor(100000, world().rank()));
    work.push_back(world().all_reduce_async(tensors.back()));
  }
  // Compute meanwhile; the communication thread drives the collectives.
  Tensor a = Tensor::randn({128, 128}, 1), b = Tensor::randn({128, 128}, 2);
  for (int i = 0; i < 10; ++i) a.copy_from(matmul(a, b));
  bool finished = false;
  for (int tries = 0; tries < 2000 && !finished; ++tries) {
    finished = work.back()->test();
    if (!finished) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_TRUE(finished) << "the async all-reduce made no progress while nobody waited on it";
  const int ranks = world().size();
  for (auto& w : work) w->wait();
  for (auto& t : tensors) EXPECT_EQ(t.to_host()[14], static_cast<float>(ranks * (ranks + 1) / 2 * 2));
}

TEST(Communicator, AsyncPointToPointBothSidesSendFirst) {
  // Every rank posts its send to the next rank before its receive from the previous one: with blocking
  // sends of a large message this ring would deadlock; asynchronous ones let compute run meanwhile.
  const int ranks = world().size(), me = world().rank();
  if (ranks < 2) GTEST_SKIP() << "needs a peer";
  Tensor out = Tensor::full({1 << 20}, static_cast<float>(me)), in = Tensor::zeros({1 << 20});
  auto send = world().send_async(out, (me + 1) % ranks, 7);
  auto recv = world().recv_async(in, (me - 1 + ranks) % ranks, 7);
  bool done = false;
  for (int tries = 0; tries < 4000 && !done; ++tries) {
    done = recv->test();
    if (!done) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  recv->wait();
  send->wait();
  EXPECT_TRUE(done);
  EXPECT_EQ(in.to_host()[12345], static_cast<float>((me - 1 + ranks) % ranks));
}

TEST(Communicator, SplitMakesIndependentGroups) {
  const int me = world().rank();
  auto group = world().split(me % 2, me);
  int members = 0, expected_sum = 0;
  for (int r = 0; r < world().size(); ++r)
    if (r % 2 == me % 2) {
      ++members;
      expected_sum += r;
    }
  EXPECT_EQ(group->size(), members);
  EXPECT_EQ(group->rank(), me / 2);
  Tensor t = Tensor::full({4}, static_cast<float>(me));
  group->all_reduce(t);
  EXPECT_EQ(t.to_host(), std::vector<float>(4, static_cast<float>(expected_sum)));
  Tensor w = Tensor::ones({2});
  algo::ring_all_reduce(*group, w);  // the hand-written ring works on a sub-communicator too
  EXPECT_EQ(w.to_host(), std::vector<float>(2, static_cast<float>(members)));
}

// The alpha-beta model's times, by hand: a ring all-reduce sends 2(n-1)/n of the bytes in 2(n-1)
// messages; all-gather and reduce-scatter half of that; a point-to-point message the bytes once.
TEST(SimulatedNetwork, TheModelIsTheRingsAlphaBeta) {
  const comm::NetworkModel m = comm::parse_network("10,1.25");  // 10 us, 1.25 GB/s: 10 GbE
  EXPECT_EQ(m.alpha_us, 10);
  EXPECT_EQ(m.gbps, 1.25);
  const double bytes = 1e6, alpha = 10e-6, beta = 1 / 1.25e9;
  EXPECT_DOUBLE_EQ(m.seconds(comm::OpKind::all_reduce, bytes, 4), 6 * alpha + 1.5 * bytes * beta);
  EXPECT_DOUBLE_EQ(m.seconds(comm::OpKind::all_gather, bytes, 4), 3 * alpha + 0.75 * bytes * beta);
  EXPECT_DOUBLE_EQ(m.seconds(comm::OpKind::reduce_scatter, bytes, 2), alpha + 0.5 * bytes * beta);
  EXPECT_DOUBLE_EQ(m.seconds(comm::OpKind::send, bytes, 2), alpha + bytes * beta);
  EXPECT_EQ(m.seconds(comm::OpKind::all_reduce, bytes, 1), 0.0);  // one rank sends nothing
  EXPECT_EQ(comm::describe(m), "alpha 10 us, 1.25 GB/s");
  for (const char* bad : {"", "10", "10;1", "10,0", "-1,1", "10,nan", "10,1,2", "1e7,1", "fast"})
    EXPECT_THROW(comm::parse_network(bad), UsageError) << bad;
}

// Under the decorator the arithmetic is the inner communicator's, untouched, and the time is at least
// the model's; the link carries one message at a time, so two all-reduces in flight take both times.
TEST(SimulatedNetwork, SameResultsAtLeastTheModelsTimeOneMessageAtATime) {
  const comm::NetworkModel m{2000, 1};  // 2 ms per message: long beside the real transfer here
  auto simulated = comm::simulate_network(world().split(0, world().rank()), m);
  EXPECT_NE(simulated->backend_name().find("simulated network"), std::string::npos);
  const int n = world().size();
  Tensor a = rank_tensor(1000, world().rank()), b = rank_tensor(1000, world().rank()), expected = a.clone();
  world().all_reduce(expected);
  const double each = m.seconds(comm::OpKind::all_reduce, 4000, n);
  const auto begin = std::chrono::steady_clock::now();
  auto first = simulated->all_reduce_async(a, ReduceOp::sum);
  auto second = simulated->all_reduce_async(b, ReduceOp::sum);
  first->wait();
  second->wait();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
  EXPECT_EQ(a.to_host(), expected.to_host());
  EXPECT_EQ(b.to_host(), expected.to_host());
  EXPECT_GE(seconds, 2 * each * 0.999) << "the two messages overlapped on the simulated link";
  auto half = simulated->split(world().rank() % 2, world().rank());  // a split group is simulated too
  EXPECT_NE(half->backend_name().find("simulated network"), std::string::npos);
}

// One number, every rank's figures, one string and one failure, agreed by every rank.
TEST(Agree, ScalarsStringsAndTheFirstError) {
  const int me = world().rank(), n = world().size();
  EXPECT_EQ(comm::all_reduce_scalar(world(), static_cast<float>(me), ReduceOp::max), static_cast<float>(n - 1));
  EXPECT_EQ(comm::all_reduce_scalar(world(), 1.0f, ReduceOp::sum), static_cast<float>(n));
  static constexpr char kSent[] = "from the last rank, \0 and all";  // a NUL byte inside, too
  const std::string sent(kSent, sizeof kSent - 1);
  std::string text = me == n - 1 ? sent : "";
  comm::broadcast_string(world(), text, n - 1);
  EXPECT_EQ(text, sent);
  EXPECT_FALSE(comm::first_error(world(), "").any());
  // Ranks 1 and up fail, each with its own message: every rank learns rank 1's.
  const auto first = comm::first_error(world(), me >= 1 ? "rank " + std::to_string(me) + " failed" : "");
  EXPECT_TRUE(first.any());
  EXPECT_EQ(first.rank, 1);
  EXPECT_EQ(first.message, "rank 1 failed");
  // Every rank's figures, exactly: a byte count past float32's 2^24, a time, a NaN's payload, a negative zero.
  const std::vector<double> mine = {static_cast<double>(me), 123456789012.0 + me, 0.1 * me, std::nan("7"), -0.0};
  const auto all = comm::all_gather_values(world(), mine);
  ASSERT_EQ(all.size(), static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) {
    const std::vector<double> theirs = {static_cast<double>(r), 123456789012.0 + r, 0.1 * r, std::nan("7"), -0.0};
    ASSERT_EQ(all[static_cast<std::size_t>(r)].size(), theirs.size());
    for (std::size_t i = 0; i < theirs.size(); ++i)
      EXPECT_EQ(std::bit_cast<std::uint64_t>(all[static_cast<std::size_t>(r)][i]), std::bit_cast<std::uint64_t>(theirs[i]))
          << "rank " << r << "'s value " << i;
  }
  EXPECT_EQ(comm::all_gather_values(world(), {}).size(), static_cast<std::size_t>(n));
}

// bfloat16 and float16 tensors travel as their type (half the bytes) and reduce in it: the small
// integers here are exact in both, so sums and maxima are exact. An average adds each rank's values
// times 1/N, rounded to 16 bits, each partial sum rounded too: exact at 2 and 4 ranks, and within N + 1
// roundings of the exact average at 3.
TEST(Communicator, SixteenBitTensorsTravelAndReduceInTheirType) {
  const int ranks = world().size(), me = world().rank();
  const std::size_t n = 1001;
  for (DType dtype : {DType::bfloat16, DType::float16}) {
    SCOPED_TRACE(dtype_name(dtype));
    std::vector<float> sum(n, 0.0f), largest(n, 0.0f);
    for (int r = 0; r < ranks; ++r)
      for (std::size_t i = 0; i < n; ++i) sum[i] += value(r, i), largest[i] = std::max(largest[i], value(r, i));

    Tensor t = rank_tensor(n, me).to(dtype);
    const std::int64_t sent = world().bytes_sent();
    world().all_reduce(t, ReduceOp::sum);
    EXPECT_EQ(world().bytes_sent() - sent, static_cast<std::int64_t>(2 * n));  // two bytes an element
    EXPECT_EQ(t.dtype(), dtype);
    EXPECT_EQ(t.to_host(), sum);
    const verify::Rounding rounding = dtype == DType::float16 ? verify::kFloat16Rounding : verify::kBfloat16Rounding;
    const auto is_the_average = [&](const std::vector<float>& got, std::size_t count) {
      for (std::size_t i = 0; i < count; ++i) {
        const double exact = static_cast<double>(sum[i]) / ranks;
        const double bound = (ranks & (ranks - 1)) == 0 ? 0.0 : verify::summation_bound(exact, ranks + 1, rounding);
        if (!(std::fabs(got[i] - exact) <= bound)) return ::testing::AssertionFailure() << i << ": " << got[i] << " for " << exact;
      }
      return ::testing::AssertionSuccess();
    };
    t = rank_tensor(n, me).to(dtype);
    world().all_reduce(t, ReduceOp::average);
    EXPECT_TRUE(is_the_average(t.to_host(), n));
    Tensor big = Tensor::full({5}, 60000.0f, Device::cpu, dtype);  // float16's largest is 65504
    const double v = big.to_host()[0];
    world().all_reduce(big, ReduceOp::average);
    for (float got : big.to_host())  // the sum would overflow in float16: the average must not
      EXPECT_LE(std::fabs(got - v), verify::summation_bound(v, ranks + 1, rounding)) << got;
    t = rank_tensor(n, me).to(dtype);
    world().all_reduce(t, ReduceOp::max);
    EXPECT_EQ(t.to_host(), largest);

    // The reduce-scatter's average and the all-gather back: every rank ends with the whole average.
    const std::size_t part = 7;
    Tensor whole = rank_tensor(part * static_cast<std::size_t>(ranks), me).to(dtype);
    Tensor mine = Tensor::zeros({static_cast<std::int64_t>(part)}, Device::cpu, dtype);
    world().reduce_scatter(whole, mine, ReduceOp::average);
    Tensor gathered = Tensor::zeros({static_cast<std::int64_t>(part) * ranks}, Device::cpu, dtype);
    world().all_gather(mine, gathered);
    EXPECT_TRUE(is_the_average(gathered.to_host(), part * static_cast<std::size_t>(ranks)));

    Tensor root = rank_tensor(n, me).to(dtype);
    world().broadcast(root, ranks - 1);
    EXPECT_EQ(root.to_host(), rank_tensor(n, ranks - 1).to_host());
    Tensor out = Tensor::full({3}, static_cast<float>(me), Device::cpu, dtype), in = Tensor::zeros({3}, Device::cpu, dtype);
    world().send_recv(out, (me + 1) % ranks, in, (me - 1 + ranks) % ranks);
    EXPECT_EQ(in.to_host(), std::vector<float>(3, static_cast<float>((me - 1 + ranks) % ranks)));
    auto receiving = world().recv_async(in, (me - 1 + ranks) % ranks, 5);
    world().send_async(out, (me + 1) % ranks, 5)->wait();
    receiving->wait();
    EXPECT_EQ(in.to_host(), std::vector<float>(3, static_cast<float>((me - 1 + ranks) % ranks)));

    Tensor wide = Tensor::zeros({static_cast<std::int64_t>(part) * ranks});
    EXPECT_THROW(world().all_gather(mine, wide), std::invalid_argument);  // one element type per call
    Tensor wide_in = Tensor::zeros({3});
    EXPECT_THROW(world().send_recv(out, (me + 1) % ranks, wide_in, (me - 1 + ranks) % ranks), std::invalid_argument);
    EXPECT_THROW(world().all_reduce_async(t, ReduceOp::sum, comm::Element::bfloat16), std::invalid_argument);
  }
}

// The in-process group (verify's model-parallel reference) against MPI itself: every 16-bit reduction
// gives the same bits at any number of ranks (both add in the ring's order, chunk by chunk, the chunks
// uneven at 1001 values); float32 sums at two ranks, where the order cannot matter (beyond, MPI adds
// float32 in an order of its own); max, and the data moves, always.
// An in-process group adds as an MPI group that adds in the ring's order (a tensor-parallel group's):
// every type, sums, averages and maxima, bit for bit at 2, 3 and 4 ranks.
TEST(LocalGroup, GivesMpisBits) {
  const std::unique_ptr<comm::Communicator> ring = world().split(0, world().rank());
  ring->add_in_ring_order();
  comm::Communicator& mpi = *ring;
  const int n = mpi.size();
  const auto data = [](int rank, DType dtype) {  // values of every size and sign, 16-bit roundings exercised
    const Tensor t = Tensor::randn({1001}, 40 + static_cast<std::uint64_t>(rank), Device::cpu, 0.0f, 3.0f);
    return t.to(dtype).clone();
  };
  verify::LocalGroup group(n);
  for (const DType dtype : {DType::float32, DType::bfloat16, DType::float16})
    for (const ReduceOp op : {ReduceOp::sum, ReduceOp::average, ReduceOp::max}) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + " " + comm::reduce_op_name(op));
      Tensor theirs = data(mpi.rank(), dtype);
      mpi.all_reduce(theirs, op);
      std::vector<Tensor> ours(static_cast<std::size_t>(n));
      group.run([&](comm::Communicator& c) {
        Tensor t = data(c.rank(), dtype);
        c.all_reduce(t, op);
        ours[static_cast<std::size_t>(c.rank())] = t;
      });
      for (const Tensor& t : ours) EXPECT_EQ(std::memcmp(t.raw(), theirs.raw(), t.nbytes()), 0);
      Tensor scattered = Tensor::zeros({7}, Device::cpu, dtype), input = data(mpi.rank(), dtype);
      Tensor slice_input = input.flat_view(0, static_cast<std::size_t>(7 * n)).clone();
      mpi.reduce_scatter(slice_input, scattered, op == ReduceOp::max ? ReduceOp::max : ReduceOp::sum);
      std::vector<Tensor> our_slices(static_cast<std::size_t>(n));
      group.run([&](comm::Communicator& c) {
        Tensor in = data(c.rank(), dtype).flat_view(0, static_cast<std::size_t>(7 * n)).clone(),
               out = Tensor::zeros({7}, Device::cpu, dtype);
        c.reduce_scatter(in, out, op == ReduceOp::max ? ReduceOp::max : ReduceOp::sum);
        our_slices[static_cast<std::size_t>(c.rank())] = out;
      });
      const Tensor& mine = our_slices[static_cast<std::size_t>(mpi.rank())];
      EXPECT_EQ(std::memcmp(mine.raw(), scattered.raw(), mine.nbytes()), 0);
    }
}

// The same at a size where the ordered sums' shared memory (comm::SharedRing, on one machine) goes round
// its slots more than once in one call, as the chunks' segments travel, and on from one call to the
// next; at no values and one; and as the same sums as MPI messages (the test's run with
// COURSE_SHM_DISABLE=1). Each gives the in-process group's bits, in every type and operation.
// Whether two tensors hold the same bytes; an empty one's memory is a null pointer, which memcmp may not take.
bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && (a.nbytes() == 0 || std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0);
}

TEST(LocalGroup, GivesMpisBitsWhereTheSumsCycleThroughSharedMemory) {
  const std::unique_ptr<comm::Communicator> ring = world().split(0, world().rank());
  ring->add_in_ring_order();
  const int n = ring->size();
  // As many values as 16-bit segments fill the slots, and an odd few, so that chunks are uneven: each rank
  // sends (2n - 1) / n of them, one and a half rounds of its slots or more.
  const std::size_t cycles = comm::SharedRing::kSegmentBytes / 2 * comm::SharedRing::kSlots + 5;
  const std::size_t scattered = 7 * comm::SharedRing::kSegmentBytes / 4 + 3;  // each rank's result, float32 segments
  verify::LocalGroup group(n);
  for (const std::size_t count : {std::size_t{0}, std::size_t{1}, cycles})
    for (const DType dtype : {DType::float32, DType::bfloat16, DType::float16})
      for (const ReduceOp op : {ReduceOp::sum, ReduceOp::average}) {
        SCOPED_TRACE(std::to_string(count) + " " + dtype_name(dtype) + " " + comm::reduce_op_name(op));
        const auto data = [&](int rank, std::size_t size) {
          return Tensor::randn({static_cast<std::int64_t>(size)}, 90 + static_cast<std::uint64_t>(rank), Device::cpu, 0.0f,
                               3.0f)
              .to(dtype)
              .clone();
        };
        Tensor theirs = data(ring->rank(), count);
        ring->all_reduce(theirs, op);
        std::vector<Tensor> ours(static_cast<std::size_t>(n));
        group.run([&](comm::Communicator& c) {
          Tensor t = data(c.rank(), count);
          c.all_reduce(t, op);
          ours[static_cast<std::size_t>(c.rank())] = t;
        });
        EXPECT_TRUE(same_bytes(ours[static_cast<std::size_t>(ring->rank())], theirs));
        const std::size_t each = count == cycles ? scattered : count;
        Tensor input = data(ring->rank(), each * static_cast<std::size_t>(n)), out = Tensor::zeros({static_cast<std::int64_t>(each)}, Device::cpu, dtype);
        const Tensor before = input.clone();
        ring->reduce_scatter(input, out, op);
        EXPECT_TRUE(same_bytes(input, before));  // the input is left as it was
        std::vector<Tensor> slices(static_cast<std::size_t>(n));
        group.run([&](comm::Communicator& c) {
          Tensor in = data(c.rank(), each * static_cast<std::size_t>(n)), o = Tensor::zeros({static_cast<std::int64_t>(each)}, Device::cpu, dtype);
          c.reduce_scatter(in, o, op);
          slices[static_cast<std::size_t>(c.rank())] = o;
        });
        EXPECT_TRUE(same_bytes(slices[static_cast<std::size_t>(ring->rank())], out));
      }
}

// Ranks whose ordered sums differ in their count or their type stop with a message, where the shared
// memory would otherwise let one add another's stale values (MPI's messages stop the job): a rank that
// meets the difference names both sums, and its neighbours stop in turn, none left waiting. The sums are
// of 16-bit values, or of float32 ones of 1 MiB, so that they take the ring at two ranks too.
TEST(SharedRing, RanksAddingDifferentSumsStopWithAMessage) {
  if (const char* off = std::getenv("COURSE_SHM_DISABLE"); off && std::string(off) == "1")
    GTEST_SKIP() << "the sums travel as MPI's messages in this run";
  const int me = world().rank(), previous = (me + world().size() - 1) % world().size();
  for (const bool types_differ : {false, true}) {
    SCOPED_TRACE(types_differ ? "types" : "counts");
    const std::unique_ptr<comm::Communicator> group = world().split(0, me);  // its own memory, left stopped
    group->add_in_ring_order();
    Tensor t = types_differ ? Tensor::ones({1 << 18}, Device::cpu, me % 2 ? DType::bfloat16 : DType::float32)
                            : Tensor::ones({1000 + 100 * me}, Device::cpu, DType::bfloat16);
    try {
      group->all_reduce(t);
      ADD_FAILURE() << "rank " << me << " finished a sum unlike its neighbours'";
    } catch (const std::runtime_error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("every rank must add the same"), std::string::npos) << what;
      if (what.find("met one of") != std::string::npos) {  // this rank met the difference itself
        EXPECT_NE(what.find(types_differ ? (previous % 2 ? "values of 2 bytes from" : "values of 4 bytes from")
                                         : "one of " + std::to_string(1000 + 100 * previous) + " values"),
                  std::string::npos)
            << what;
      }
    }
    Tensor again = Tensor::ones({1000}, Device::cpu, DType::bfloat16);
    EXPECT_THROW(group->all_reduce(again), std::runtime_error);  // a stopped group stays stopped
  }
  // COURSE_SHM_DISABLE takes 0 or 1; anything else is refused, naming it, on every rank alike.
  const std::unique_ptr<comm::Communicator> group = world().split(0, me);
  setenv("COURSE_SHM_DISABLE", "yes", 1);
  Tensor t = Tensor::ones({10}, Device::cpu, DType::bfloat16);
  try {
    group->all_reduce(t);
    ADD_FAILURE() << "COURSE_SHM_DISABLE=yes was taken";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()), "COURSE_SHM_DISABLE: 'yes' is not 0 or 1");
  }
  unsetenv("COURSE_SHM_DISABLE");
}

// The order is the group's, however it is reached: through a wrapper (a simulated network, as chapter
// 08 builds its grid on one, or a fault) the flag set on the wrapper reaches the group it wraps, and a
// group split from either adds in the same order. Each gives the in-process group's float32 bits.
TEST(LocalGroup, WrappedAndSplitGroupsAddInTheRingsOrderToo) {
  const int n = world().size();
  const auto data = [](int rank) { return Tensor::randn({1001}, 70 + static_cast<std::uint64_t>(rank), Device::cpu, 0.0f, 3.0f); };
  std::vector<Tensor> ours(static_cast<std::size_t>(n));
  verify::LocalGroup group(n);
  group.run([&](comm::Communicator& c) {
    Tensor t = data(c.rank());
    c.all_reduce(t, ReduceOp::sum);
    ours[static_cast<std::size_t>(c.rank())] = t;
  });
  auto simulated = comm::simulate_network(world().split(0, world().rank()), comm::NetworkModel{0.0, 1000.0});
  simulated->add_in_ring_order();
  auto split = simulated->split(0, world().rank());
  for (comm::Communicator* c : {simulated.get(), split.get()}) {
    EXPECT_TRUE(c->adds_in_ring_order());
    Tensor theirs = data(c->rank());
    c->all_reduce(theirs, ReduceOp::sum);
    EXPECT_EQ(std::memcmp(theirs.raw(), ours[static_cast<std::size_t>(c->rank())].raw(), theirs.nbytes()), 0);
  }
}

TEST(Communicator, RejectsBadArguments) {
  Tensor t = Tensor::zeros({4});
  EXPECT_THROW(world().broadcast(t, world().size()), std::invalid_argument);
  EXPECT_THROW(world().reduce(t, -1), std::invalid_argument);
  EXPECT_THROW(algo::tree_broadcast(world(), t, world().size() + 3), std::invalid_argument);
  Tensor wrong = Tensor::zeros({4 * world().size() + 1});
  EXPECT_THROW(world().all_gather(t, wrong), std::invalid_argument);
  EXPECT_THROW(world().reduce_scatter(wrong, t), std::invalid_argument);
}

}  // namespace
}  // namespace course::testing

COURSE_MPI_TEST_MAIN()
