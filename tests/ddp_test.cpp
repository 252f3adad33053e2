// DistributedDataParallel under mpirun with 1, 2, 3 and 4 ranks, checked in lock-step against one rank
// with the global batch: every step's averaged gradient must equal the exact mean of the ranks' shares
// recomputed on one rank, within the float32 bound (common/verify). Also with no_sync accumulation,
// a dataset that does not divide evenly, and many steps; a deliberately wrong average must fail at
// the step it starts; differently seeded ranks end identical.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>

#include "04_ddp/data_parallel.h"
#include "common/data/house_prices.h"
#include "common/nn/gpt.h"
#include "common/nn/layers.h"
#include "common/ops/ops.h"
#include "common/optim/grad_scaler.h"
#include "common/optim/optimizer.h"
#include "common/parallel/ddp.h"
#include "common/parallel/distributed_sampler.h"
#include "common/parallel/replicas.h"  // parameter_checksum
#include "common/verify/lockstep.h"
#include "support/mpi_main.h"

namespace course::testing {
namespace {

struct RunSetup {
  std::int64_t samples = 400, global_batch = 48;
  int steps = 6, accum = 1;
  float lr = 0.05f;
  int broken_from = -1;  // the step from which the gradient average is wrong, or -1
  bool skip_share = false;  // how it is wrong: the last rank's share skipped, or divided twice
  DType reduce_dtype = DType::float32;  // ReducerOptions::reduce_dtype
};

std::shared_ptr<nn::Sequential> mlp(std::uint64_t seed) {
  return nn::make_mlp(6, 16, 2, 1, nn::Activation::gelu, Device::cpu, seed);
}

Tensor batch_loss(nn::Module& model, const data::Dataset& d, const std::vector<std::int64_t>& samples) {
  data::Batch b = data::make_batch(d, samples, Device::cpu);
  return mse_loss(model(b.x), b.y);
}

// One rank's share in `accum` micro-batches, each weighted by its share; `backward(loss, last)`.
template <class Backward>
float accumulate(nn::Module& model, const data::Dataset& d, const std::vector<std::int64_t>& share, int accum,
                 Backward backward) {
  auto micro = data::split_batches(share, (static_cast<std::int64_t>(share.size()) + accum - 1) / accum);
  float total = 0;
  for (std::size_t i = 0; i < micro.size(); ++i) {
    Tensor loss = scale(batch_loss(model, d, micro[i]), static_cast<float>(micro[i].size()) / static_cast<float>(share.size()));
    backward(loss, i + 1 == micro.size());
    total += loss.item();
  }
  return total;
}

// Every rank trains its share with DDP, checked in lock-step; returns the verdict.
verify::LockstepSummary train_checked(const RunSetup& s, parallel::DistributedDataParallel& ddp, const data::Dataset& d) {
  const int ranks = world().size();
  int step_now = 0;
  if (s.broken_from >= 0)
    ddp.register_comm_hook([&](comm::Communicator& group, Tensor& g) {
      const bool broken = step_now >= s.broken_from;
      if (broken && s.skip_share && group.rank() == group.size() - 1) g.fill_(0.0f);
      parallel::average_hook(s.reduce_dtype)(group, g)->wait();
      if (broken && !s.skip_share) g.copy_from(scale(g, 1.0f / static_cast<float>(group.size())));
      return comm::completed_work();
    });
  nn::Module& model = ddp.module();
  optim::SGD sgd(model.parameters(), s.lr, 0.9f);
  parallel::DistributedSampler sampler(d.size, world(), 3);
  const std::int64_t local = s.global_batch / ranks;
  auto reference = mlp(1);
  optim::SGD reference_sgd(reference->parameters(), s.lr, 0.9f);
  verify::Lockstep lockstep(reference, [&](std::int64_t) {
    reference_sgd.step();
    reference_sgd.zero_grad();
  }, &world());
  lockstep.set_rounding(verify::rounding_of(s.reduce_dtype));  // the parts added in 16 bits: their bound
  for (int step = 0; step < s.steps; ++step) {
    step_now = step;
    lockstep.begin_step(step, model);
    float mine = accumulate(model, d, sampler.batch(step, local), s.accum, [&](Tensor& loss, bool last) {
      if (last) {
        loss.backward();
      } else {
        auto guard = ddp.no_sync();
        loss.backward();
      }
    });
    Tensor loss = Tensor::from_host({mine}, {1});
    world().all_reduce(loss, comm::ReduceOp::average);
    const auto global = sampler.global_batch(step, local);
    lockstep.check_parts(step, model, loss.item(), static_cast<std::size_t>(ranks), 1.0 / ranks,
                   [&](nn::Module& reference, std::size_t r) {
                     const auto theirs = parallel::DistributedSampler::share_of(global, static_cast<int>(r), ranks);
                     return accumulate(reference, d, theirs, s.accum, [](Tensor& l, bool) { l.backward(); });
                   });
    sgd.step();
    sgd.zero_grad();
    lockstep.check_update(step);
  }
  return lockstep.finish(model);
}

verify::LockstepSummary run(const RunSetup& s) {
  data::Dataset d = data::make_house_prices_wide(s.samples, 6, 5);
  // Rank r starts from seed 1 + 100 r; DDP's broadcast gives everyone rank 0's weights (seed 1).
  parallel::ReducerOptions options;
  options.reduce_dtype = s.reduce_dtype;
  parallel::DistributedDataParallel ddp(mlp(1 + 100 * static_cast<std::uint64_t>(world().rank())), world(), options);
  auto summary = train_checked(s, ddp, d);
  EXPECT_TRUE(ddp.parameters_identical());
  EXPECT_EQ(ddp.synchronisations(), s.steps);  // once per step, never inside no_sync
  if (world().size() > 1 && s.broken_from < 0) {
    // Every gradient handed to the all-reduce once a step, in the reduce type: 4 or 2 bytes an element
    // (a 16-bit bucket of odd length is padded by one element).
    const double elements = static_cast<double>(ddp.module().parameter_count()) * s.steps;
    const double per_element = static_cast<double>(ddp.reducer().bytes_communicated()) / elements;
    EXPECT_NEAR(per_element, static_cast<double>(element_size(s.reduce_dtype)), 0.05) << dtype_name(s.reduce_dtype);
  }
  return summary;
}

void expect_passes(const RunSetup& s) {
  auto summary = run(s);
  EXPECT_TRUE(summary.passed) << world().size() << " ranks: " << summary.first_failure;
  EXPECT_EQ(summary.steps, s.steps);
  EXPECT_LE(summary.worst_gradient_ratio, 1.0);
}

TEST(DistributedDataParallel, MatchesSingleRankInLockStep) { expect_passes(RunSetup{}); }

// Data parallelism with a loss scale: an inf in the last rank's gradient alone makes every rank skip the
// step and back off (the check is one all-reduce), so the replicas stay identical; a clean step steps
// everywhere.
TEST(DistributedDataParallel, GradScalerSkipsOnEveryRankWhenOneRankOverflows) {
  Tensor w = Tensor::from_host({1.0f, 2.0f}, {2}).set_requires_grad(true);
  optim::SGD sgd({w}, 0.5f);
  optim::GradScaler scaler({}, &world());
  const bool last = world().rank() == world().size() - 1;
  w.set_grad(Tensor::from_host({65536.0f, last ? INFINITY : 65536.0f}, {2}));
  EXPECT_FALSE(scaler.step(sgd));
  scaler.update();
  EXPECT_EQ(w.to_host(), (std::vector<float>{1.0f, 2.0f}));
  EXPECT_EQ(scaler.get_scale(), 32768.0f);
  w.set_grad(Tensor::from_host({32768.0f, 32768.0f}, {2}));
  EXPECT_TRUE(scaler.step(sgd));
  EXPECT_EQ(w.to_host(), (std::vector<float>{0.5f, 1.5f}));
}

// --reduce-dtype: the buckets averaged in bf16 or fp16 (half the bytes), checked in lock-step with the
// bound of 16-bit sums; a wrong average still fails at the step it starts.
TEST(DistributedDataParallel, AveragesIn16BitsWithinTheirBoundAndCatchesAWrongAverage) {
  for (DType type : {DType::bfloat16, DType::float16}) {
    RunSetup s;
    s.reduce_dtype = type;
    s.accum = 2;
    expect_passes(s);
    s.broken_from = 3;
    s.skip_share = true;
    auto summary = run(s);
    EXPECT_FALSE(summary.passed) << dtype_name(type);
    EXPECT_EQ(summary.first_failed_step, 3) << dtype_name(type);
  }
}

TEST(DistributedDataParallel, MatchesWithAccumulationUnderNoSync) {
  RunSetup s;
  s.accum = 3;
  s.global_batch = 72;
  expect_passes(s);
}

TEST(DistributedDataParallel, MatchesWhenTheDatasetDoesNotDivideEvenly) {
  RunSetup s;
  s.samples = 101;  // prime: padded for every rank count > 1, and the last batch is partial
  s.global_batch = 24;
  s.steps = 12;     // more than one epoch
  expect_passes(s);
}

TEST(DistributedDataParallel, StaysInLockStepOverManySteps) {
  RunSetup s;
  s.steps = 300;  // long after free-running runs would have drifted apart
  s.lr = 0.01f;   // 0.05 with momentum diverges over this many steps
  expect_passes(s);
}

TEST(DistributedDataParallel, AWrongAverageFailsAtTheStepItStarts) {
  RunSetup s;
  s.broken_from = 3;
  s.skip_share = true;  // the last rank's share never arrives (at one rank: no gradient at all)
  auto summary = run(s);
  EXPECT_FALSE(summary.passed);
  EXPECT_EQ(summary.first_failed_step, 3);
  if (world().size() > 1) {
    s.skip_share = false;  // divided by the world size twice (the same as once on one rank)
    summary = run(s);
    EXPECT_FALSE(summary.passed);
    EXPECT_EQ(summary.first_failed_step, 3);
    if (world().rank() == 0) {
      EXPECT_NE(summary.first_failure.find("gradient of"), std::string::npos) << summary.first_failure;
    }
  }
}

TEST(DistributedDataParallel, DifferentlySeededRanksStartIdentical) {
  auto model = mlp(1000 + static_cast<std::uint64_t>(world().rank()));
  auto before = model->parameters_to_host();
  parallel::DistributedDataParallel ddp(model, world());
  EXPECT_TRUE(ddp.parameters_identical());
  EXPECT_EQ(model->parameters_to_host(), mlp(1000)->parameters_to_host());  // everyone now holds rank 0's initial weights
  if (world().size() > 1 && world().rank() > 0) {
    EXPECT_NE(before, model->parameters_to_host());
  }
}

TEST(DistributedDataParallel, ChecksumDetectsADifferentRank) {
  auto model = mlp(9);
  parallel::DistributedDataParallel ddp(model, world());
  if (world().rank() == world().size() - 1) {
    Tensor w = model->parameters()[0];
    auto v = w.to_host();
    v[0] = std::nextafter(v[0], 1e9f);  // one bit of one weight
    w.copy_from(Tensor::from_host(v, w.shape()));
  }
  EXPECT_EQ(ddp.parameters_identical(), world().size() == 1);
}

// The replicas' checksum over tensors is the one over their values on the host, and a flipped bit
// anywhere, in every lane and in a tail shorter than the eight lanes' 64 bytes, changes it.
TEST(ParameterChecksum, TensorsAndTheirHostValuesAgreeAndEveryFlippedBitShows) {
  auto model = mlp(3);
  const std::vector<Tensor> parameters = model->parameters();
  const std::vector<float> values = model->parameters_to_host();
  ASSERT_NE(values.size() % 16, 0u);  // a tail the lanes' blocks do not fill
  const std::uint64_t sum = parallel::parameter_checksum(values);
  EXPECT_EQ(parallel::parameter_checksum(parameters), sum);
  for (std::size_t i : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{9}, values.size() - 1})
    for (int bit : {0, 13, 31}) {
      std::vector<float> flipped = values;
      flipped[i] = std::bit_cast<float>(std::bit_cast<std::uint32_t>(flipped[i]) ^ (1u << bit));
      EXPECT_NE(parallel::parameter_checksum(flipped), sum) << "value " << i << ", bit " << bit;
    }
}

TEST(DistributedDataParallel, NamesAParameterThatGotNoGradientWhenBackwardEnds) {
  auto model = mlp(2);
  parallel::DistributedDataParallel ddp(model, world());
  // Backward through only the first layer's weight: the end-of-backward callback finds the others missing.
  auto params = model->parameters();
  try {
    sum(params[0]).backward();
    FAIL() << "backward did not report the parameters without a gradient";
  } catch (const std::logic_error& e) {
    EXPECT_NE(std::string(e.what()).find("parameter '0.bias' received no gradient"), std::string::npos) << e.what();
  }
  // The reducer is ready for the next, complete pass: nothing is left over from the failed one.
  Tensor x = Tensor::randn({4, 6}, 1);
  EXPECT_NO_THROW(sum(ddp(x)).backward());
}

// Full activation recomputation under DDP's overlapped buckets: each block's parameters get their
// gradients in an inner backward run inside the outer one; their hooks launch the buckets there, and
// DDP's end-of-backward callback still waits for the outer pass. The averaged gradients are those of
// the same model without recomputation, bit for bit, synchronised once.
TEST(DistributedDataParallel, FullRecomputationAveragesTheSameGradientsOnce) {
  nn::GPTConfig c{3, 2, 16, 8, 12, 0.0f};
  std::vector<float> ids, targets;
  for (int i = 0; i < 32; ++i) {
    ids.push_back(static_cast<float>((i * 5 + world().rank()) % 12));
    targets.push_back(static_cast<float>((i * 7 + world().rank()) % 12));
  }
  std::vector<std::vector<float>> gradients[2];
  for (int recompute = 0; recompute < 2; ++recompute) {
    c.recompute = recompute ? nn::Recompute::full : nn::Recompute::none;
    auto gpt = std::make_shared<nn::GPT>(c, Device::cpu, 5);
    parallel::ReducerOptions options;
    options.bucket_cap_mb = 0.002;  // several buckets, launched from inside the recomputed blocks' passes
    options.first_bucket_mb = 0.001;
    parallel::DistributedDataParallel ddp(gpt, world(), options);
    cross_entropy(ddp(Tensor::from_host(ids, {4, 8})), Tensor::from_host(targets, {32})).backward();
    EXPECT_EQ(ddp.synchronisations(), 1);
    EXPECT_GT(ddp.reducer().buckets().size(), 2u);
    for (const Tensor& p : gpt->parameters()) gradients[recompute].push_back(p.grad().to_host());
  }
  EXPECT_EQ(gradients[1], gradients[0]);
}

TEST(DataParallelNaive, ATiedWeightIsOneParameterOneGradientOneAllReduce) {
  // Chapter 04's DDP. The GPT's head is its token table: the weight is used twice in the forward, yet
  // it is one parameter with one gradient, all-reduced once.
  nn::GPTConfig c{1, 2, 16, 8, 12, 0.0f};
  auto gpt = std::make_shared<nn::GPT>(c, Device::cpu, 3 + static_cast<std::uint64_t>(world().rank()));
  chapter04::DataParallelNaive ddp(gpt, world());
  // The same weights, outside DDP, for each rank's local gradient.
  auto local = std::make_shared<nn::GPT>(c, Device::cpu, 99);
  for (std::size_t i = 0; i < local->parameters().size(); ++i) local->parameters()[i].copy_from(gpt->parameters()[i]);
  std::vector<float> ids, targets;
  for (int i = 0; i < 16; ++i) {
    ids.push_back(static_cast<float>((i * 5 + world().rank()) % 11));  // token 11 never appears as an input
    targets.push_back(static_cast<float>((i * 7 + world().rank()) % 12));
  }
  auto loss = [&](nn::GPT& m) { return cross_entropy(m(Tensor::from_host(ids, {2, 8})), Tensor::from_host(targets, {16})); };
  loss(*gpt).backward();
  loss(*local).backward();
  ddp.all_reduce_gradients();
  EXPECT_EQ(ddp.stats().messages_per_step, gpt->parameters().size());
  EXPECT_EQ(ddp.stats().bytes, 4 * gpt->parameter_count());
  EXPECT_TRUE(ddp.parameters_identical());  // the broadcast made them so, whatever each rank's seed
  Tensor expected = local->wte.grad();
  world().all_reduce(expected, comm::ReduceOp::average);
  EXPECT_EQ(gpt->wte.grad().to_host(), expected.to_host());
  auto row11 = gpt->wte.grad().to_host();
  EXPECT_NE(std::vector<float>(row11.begin() + 11 * 16, row11.end()), std::vector<float>(16, 0.0f));  // from the head
}

// Exercise 04.1's broadcast: whatever seed each rank starts from, rank 0's parameters, every one of them.
TEST(DataParallelNaive, RanksSeededDifferentlyStartFromRankZerosParameters) {
  auto model = mlp(40 + static_cast<std::uint64_t>(world().rank()));
  chapter04::DataParallelNaive ddp(model, world());
  const auto rank0 = mlp(40);  // what rank 0 initialised
  for (std::size_t i = 0; i < model->parameters().size(); ++i)
    EXPECT_EQ(model->parameters()[i].to_host(), rank0->parameters()[i].to_host())
        << "parameter " << i << " on rank " << world().rank() << " is not rank 0's";
}

// Exercise 04.1's average: every parameter's gradient, the last one too, becomes the mean of the ranks'
// (ReduceOp::average's bits), and the parameters themselves are untouched.
TEST(DataParallelNaive, EveryGradientBecomesTheMeanOfTheRanks) {
  auto model = mlp(7);
  chapter04::DataParallelNaive ddp(model, world());
  auto local = mlp(7);
  const data::Dataset d = data::make_house_prices_wide(64, 6, 5);
  std::vector<std::int64_t> share;
  for (std::int64_t i = world().rank(); i < 64; i += world().size()) share.push_back(i);
  batch_loss(*model, d, share).backward();
  batch_loss(*local, d, share).backward();
  ddp.all_reduce_gradients();
  ASSERT_EQ(model->parameters().size(), local->parameters().size());
  for (std::size_t i = 0; i < local->parameters().size(); ++i) {
    Tensor expected = local->parameters()[i].grad().clone();
    world().all_reduce(expected, comm::ReduceOp::average);
    EXPECT_EQ(model->parameters()[i].grad().to_host(), expected.to_host()) << "the gradient of parameter " << i;
    EXPECT_EQ(model->parameters()[i].to_host(), local->parameters()[i].to_host()) << "parameter " << i << " changed";
  }
  EXPECT_EQ(ddp.stats().messages_per_step, model->parameters().size());  // one all-reduce per gradient
}

// Exercise 04.1's check: a parameter that received no gradient is named before any rank waits for it.
TEST(DataParallelNaive, AParameterWithoutAGradientIsALogicError) {
  chapter04::DataParallelNaive ddp(mlp(7), world());
  EXPECT_THROW(ddp.all_reduce_gradients(), std::logic_error);
}

TEST(DistributedSampler, RanksBatchesMakeUpTheGlobalBatch) {
  parallel::DistributedSampler sampler(101, world(), 7);
  const std::int64_t local = 5;
  for (std::int64_t step : {0, 1, 20, 21, 45}) {  // 21 steps an epoch: the last is partial, and epochs roll over
    auto mine = sampler.batch(step, local);
    auto global = sampler.global_batch(step, local);
    EXPECT_EQ(mine, parallel::DistributedSampler::share_of(global, world().rank(), world().size()));
    ASSERT_EQ(global.size(), mine.size() * static_cast<std::size_t>(world().size()));
    std::vector<float> as_float(mine.begin(), mine.end());
    Tensor gathered = Tensor::zeros({static_cast<std::int64_t>(global.size())});
    world().all_gather(Tensor::from_host(as_float, {static_cast<std::int64_t>(mine.size())}), gathered);
    auto all = gathered.to_host();
    // Rank r's i-th sample is the global batch's entry i*R + r.
    for (int r = 0; r < world().size(); ++r)
      for (std::size_t i = 0; i < mine.size(); ++i)
        EXPECT_EQ(static_cast<std::int64_t>(all[static_cast<std::size_t>(r) * mine.size() + i]),
                  global[i * static_cast<std::size_t>(world().size()) + static_cast<std::size_t>(r)]);
  }
}

}  // namespace
}  // namespace course::testing

COURSE_MPI_TEST_MAIN()
