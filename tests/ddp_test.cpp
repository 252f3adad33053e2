// DistributedDataParallel under mpirun with 1, 2, 3 and 4 ranks: after K steps with R ranks each doing
// global/R samples, the parameters equal a single-rank run with the global batch; also with no_sync
// accumulation and a dataset that does not divide evenly; ranks seeded differently end identical.
#include <gtest/gtest.h>

#include <cmath>

#include "common/data/house_prices.h"
#include "common/nn/layers.h"
#include "common/ops/ops.h"
#include "common/optim/optimizer.h"
#include "common/parallel/ddp.h"
#include "common/parallel/distributed_sampler.h"
#include "support/mpi_main.h"

namespace course::testing {
namespace {

// The two computations add the same per-sample gradients in a different order (R partial sums and an
// all-reduce, against one sum): float32 rounding of ~1e-7 relative per step, over a few steps.
constexpr float kTolerance = 1e-5f;

struct RunSetup {
  std::int64_t samples = 400, global_batch = 48;
  int steps = 6, accum = 1;
};

std::shared_ptr<nn::Sequential> mlp(std::uint64_t seed) {
  return nn::make_mlp(6, 16, 2, 1, nn::Activation::gelu, Device::cpu, seed);
}

// One rank trains the whole global batch: the reference.
std::vector<float> single_rank(const RunSetup& s, const data::Dataset& d, int ranks) {
  auto model = mlp(1);
  optim::SGD sgd(model->parameters(), 0.05f, 0.9f);
  parallel::DistributedSampler sampler(d.size, ranks, 0, 3);
  const std::int64_t local = s.global_batch / ranks, per_epoch = (sampler.num_samples() + local - 1) / local;
  for (int step = 0; step < s.steps; ++step) {
    sampler.set_epoch(static_cast<std::uint64_t>(step / per_epoch));
    auto order = sampler.global_order();
    std::int64_t begin = (step % per_epoch) * local, end = std::min(sampler.num_samples(), begin + local);
    std::vector<std::int64_t> batch(order.begin() + begin * ranks, order.begin() + end * ranks);
    data::Batch b = data::make_batch(d, batch, Device::cpu);
    mse_loss((*model)(b.x), b.y).backward();
    sgd.step();
    sgd.zero_grad();
  }
  return model->parameters_to_host();
}

// Every rank trains its share with DDP.
std::vector<float> data_parallel(const RunSetup& s, const data::Dataset& d, parallel::DistributedDataParallel& ddp) {
  const int ranks = world().size();
  nn::Module& model = ddp.module();
  optim::SGD sgd(model.parameters(), 0.05f, 0.9f);
  parallel::DistributedSampler sampler(d.size, ranks, world().rank(), 3);
  const std::int64_t local = s.global_batch / ranks, per_epoch = (sampler.num_samples() + local - 1) / local;
  for (int step = 0; step < s.steps; ++step) {
    sampler.set_epoch(static_cast<std::uint64_t>(step / per_epoch));
    auto mine = sampler.indices();
    std::int64_t begin = (step % per_epoch) * local, end = std::min(sampler.num_samples(), begin + local);
    std::vector<std::int64_t> share(mine.begin() + begin, mine.begin() + end);
    auto micro = data::split_batches(share, (static_cast<std::int64_t>(share.size()) + s.accum - 1) / s.accum);
    for (std::size_t i = 0; i < micro.size(); ++i) {
      data::Batch b = data::make_batch(d, micro[i], Device::cpu);
      Tensor loss = scale(mse_loss(ddp(b.x), b.y), static_cast<float>(micro[i].size()) / static_cast<float>(share.size()));
      if (i + 1 < micro.size()) {
        auto guard = ddp.no_sync();
        loss.backward();
      } else {
        loss.backward();
      }
    }
    sgd.step();
    sgd.zero_grad();
  }
  return model.parameters_to_host();
}

void expect_equivalent(const RunSetup& s) {
  data::Dataset d = data::make_house_prices_wide(s.samples, 6, 5);
  // Rank r starts from seed 1 + 100 r; DDP's broadcast gives everyone rank 0's weights (seed 1).
  parallel::DistributedDataParallel ddp(mlp(1 + 100 * static_cast<std::uint64_t>(world().rank())), world());
  auto distributed = data_parallel(s, d, ddp);
  auto reference = single_rank(s, d, world().size());
  ASSERT_EQ(distributed.size(), reference.size());
  float worst = 0;
  for (std::size_t i = 0; i < reference.size(); ++i) worst = std::max(worst, std::fabs(distributed[i] - reference[i]));
  EXPECT_LE(worst, kTolerance) << world().size() << " ranks";
  EXPECT_TRUE(ddp.parameters_identical());
  EXPECT_EQ(ddp.synchronisations(), s.steps);  // once per step, never inside no_sync
}

TEST(DistributedDataParallel, MatchesSingleRankWithTheGlobalBatch) { expect_equivalent(RunSetup{}); }

TEST(DistributedDataParallel, MatchesWithAccumulationUnderNoSync) {
  RunSetup s;
  s.accum = 3;
  s.global_batch = 72;
  expect_equivalent(s);
}

TEST(DistributedDataParallel, MatchesWhenTheDatasetDoesNotDivideEvenly) {
  RunSetup s;
  s.samples = 101;  // prime: padded for every rank count > 1, and the last batch is partial
  s.global_batch = 24;
  s.steps = 12;     // more than one epoch
  expect_equivalent(s);
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

TEST(DistributedDataParallel, RejectsAParameterThatGotNoGradient) {
  auto model = mlp(2);
  parallel::DistributedDataParallel ddp(model, world());
  // Backward through only the first layer's weight: the other parameters never become ready.
  auto params = model->parameters();
  sum(params[0]).backward();
  EXPECT_THROW(ddp(Tensor::zeros({1, 6})), std::logic_error);
}

}  // namespace
}  // namespace course::testing

COURSE_MPI_TEST_MAIN()
