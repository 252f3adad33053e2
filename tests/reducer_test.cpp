// The Reducer under mpirun with 2, 3 and 4 ranks: bucket assignment (reverse order, caps, every
// parameter once, gradients as views into the bucket buffer), every synchronisation mode checked in
// lock-step against one rank (caps smaller than any parameter and larger than the model, overlap, and
// after the rebuild), no_sync accumulation in buckets, unused parameters, and the simulated network's
// delays against the alpha-beta formula.
#include <gtest/gtest.h>

#include <set>

#include "common/data/house_prices.h"
#include "common/nn/layers.h"
#include "common/ops/ops.h"
#include "common/optim/optimizer.h"
#include "common/parallel/comm_hooks.h"
#include "common/parallel/ddp.h"
#include "common/parallel/distributed_sampler.h"
#include "common/verify/lockstep.h"
#include "support/mpi_main.h"

namespace course::testing {
namespace {

constexpr double kKiB = 1.0 / 1024.0;  // in MB, for caps

std::shared_ptr<nn::Sequential> mlp(std::uint64_t seed) {
  return nn::make_mlp(6, 64, 3, 1, nn::Activation::relu, Device::cpu, seed);  // weights of 1.5, 16 and 16 KiB
}

Tensor batch_loss(nn::Module& model, const data::Dataset& d, const std::vector<std::int64_t>& samples) {
  data::Batch b = data::make_batch(d, samples, Device::cpu);
  return mse_loss(model(b.x), b.y);
}

// Trains with DDP under `options` for `steps` steps in `accum` micro-batches, checked in lock-step.
verify::LockstepSummary train(const parallel::ReducerOptions& options, int steps, int accum = 1,
                              const std::string& hook = "none", verify::Rounding rounding = verify::kFloat32Rounding,
                              std::int64_t* bytes = nullptr) {
  const int ranks = world().size();
  data::Dataset d = data::make_house_prices_wide(300, 6, 5);
  parallel::DistributedDataParallel ddp(mlp(1 + static_cast<std::uint64_t>(world().rank())), world(), options);
  ddp.register_comm_hook(parallel::comm_hook_named(hook));
  optim::SGD sgd(ddp.module().parameters(), 0.02f, 0.9f);
  parallel::DistributedSampler sampler(d.size, world(), 3);
  const std::int64_t local = 12;
  auto reference = mlp(1);
  optim::SGD reference_sgd(reference->parameters(), 0.02f, 0.9f);
  verify::Lockstep lockstep(reference, [&](std::int64_t) {
    reference_sgd.step();
    reference_sgd.zero_grad();
  }, &world());
  lockstep.set_rounding(rounding);
  for (int step = 0; step < steps; ++step) {
    lockstep.begin_step(step, ddp.module());
    auto share = sampler.batch(step, local);
    auto micro = data::split_batches(share, (local + accum - 1) / accum);
    float loss_sum = 0;
    for (std::size_t i = 0; i < micro.size(); ++i) {
      Tensor loss = scale(batch_loss(ddp.module(), d, micro[i]), static_cast<float>(micro[i].size()) / local);
      if (i + 1 < micro.size()) {
        auto guard = ddp.no_sync();
        loss.backward();
      } else {
        loss.backward();
      }
      loss_sum += loss.item();
    }
    Tensor loss = Tensor::from_host({loss_sum}, {1});
    world().all_reduce(loss, comm::ReduceOp::average);
    const auto global = sampler.global_batch(step, local);
    lockstep.check_parts(step, ddp.module(), loss.item(), static_cast<std::size_t>(ranks), 1.0 / ranks,
                   [&](nn::Module& reference, std::size_t r) {
                     const auto theirs = parallel::DistributedSampler::share_of(global, static_cast<int>(r), ranks);
                     auto pieces = data::split_batches(theirs, (local + accum - 1) / accum);
                     float total = 0;
                     for (auto& piece : pieces) {
                       Tensor l = scale(batch_loss(reference, d, piece), static_cast<float>(piece.size()) / local);
                       l.backward();
                       total += l.item();
                     }
                     return total;
                   });
    sgd.step();
    sgd.zero_grad();
    lockstep.check_update(step);
  }
  if (bytes) *bytes = ddp.reducer().bytes_communicated();
  EXPECT_TRUE(ddp.parameters_identical());
  EXPECT_EQ(ddp.reducer().rebuilt(), options.rebuild_buckets && steps > 0);
  return lockstep.finish(ddp.module());
}

TEST(Reducer, BucketsInReverseOrderWithinTheirCaps) {
  auto model = mlp(1);
  auto named = model->named_parameters();
  parallel::ReducerOptions options;
  options.first_bucket_mb = 2 * kKiB;  // the output layer (65 floats) and one more small tensor
  options.bucket_cap_mb = 20 * kKiB;   // one 16 KiB weight and its bias at most
  parallel::Reducer reducer(named, world(), options);
  std::vector<std::size_t> seen;
  for (std::size_t b = 0; b < reducer.buckets().size(); ++b) {
    const auto& bucket = reducer.buckets()[b];
    const double cap = (b == 0 ? options.first_bucket_mb : options.bucket_cap_mb) * 1024 * 1024;
    std::size_t bytes = 0;
    for (std::size_t k = 0; k < bucket.parameters.size(); ++k) {
      const Tensor& p = named[bucket.parameters[k]].second;
      bytes += p.nbytes();
      // The gradient is a view into the bucket's buffer, at its offset.
      EXPECT_EQ(p.grad().data(), bucket.buffer.data() + bucket.offsets[k]) << named[bucket.parameters[k]].first;
      seen.push_back(bucket.parameters[k]);
    }
    EXPECT_TRUE(bytes <= cap || bucket.parameters.size() == 1) << "bucket " << b << " holds " << bytes;
  }
  // Every parameter exactly once, in reverse registration order.
  ASSERT_EQ(seen.size(), named.size());
  for (std::size_t i = 0; i < seen.size(); ++i) EXPECT_EQ(seen[i], named.size() - 1 - i);
  EXPECT_GE(reducer.buckets().size(), 3u);
}

TEST(Reducer, EveryModeMatchesOneRankInLockStep) {
  parallel::ReducerOptions flat, buckets, overlap, tiny, huge, no_rebuild;
  flat.bucket_cap_mb = flat.first_bucket_mb = 1e6;
  flat.overlap = false;
  buckets.bucket_cap_mb = 20 * kKiB;
  buckets.overlap = false;
  overlap.bucket_cap_mb = 20 * kKiB;
  overlap.first_bucket_mb = 2 * kKiB;
  tiny.bucket_cap_mb = tiny.first_bucket_mb = 1e-6;  // smaller than the smallest parameter
  huge.bucket_cap_mb = huge.first_bucket_mb = 1e6;   // larger than the whole model
  no_rebuild.rebuild_buckets = false;
  for (const auto& options : {flat, buckets, overlap, tiny, huge, no_rebuild}) {
    auto summary = train(options, 6);  // the rebuild happens after step 0
    EXPECT_TRUE(summary.passed) << summary.first_failure;
    EXPECT_EQ(summary.steps, 6);
  }
}

TEST(Reducer, NoSyncAccumulatesInTheBuckets) {
  parallel::ReducerOptions overlap;
  overlap.bucket_cap_mb = 20 * kKiB;
  auto summary = train(overlap, 4, 3);
  EXPECT_TRUE(summary.passed) << summary.first_failure;
}

TEST(Reducer, SixteenBitHooksHalveTheBytesWithinTheirBound) {
  parallel::ReducerOptions overlap;
  overlap.bucket_cap_mb = 20 * kKiB;
  std::int64_t full = 0, fp16 = 0, bf16 = 0;
  EXPECT_TRUE(train(overlap, 4, 1, "none", verify::kFloat32Rounding, &full).passed);
  auto summary = train(overlap, 4, 1, "fp16", verify::kFloat16Rounding, &fp16);
  EXPECT_TRUE(summary.passed) << summary.first_failure;
  summary = train(overlap, 4, 1, "bf16", verify::kBfloat16Rounding, &bf16);
  EXPECT_TRUE(summary.passed) << summary.first_failure;
  // Half the bytes, up to one padding value per odd-sized bucket.
  EXPECT_LE(fp16, full / 2 + 64);
  EXPECT_GE(fp16, full / 2);
  EXPECT_EQ(bf16, fp16);
  // The compression really happened: the result is outside float32's bound.
  if (world().size() > 1) {
    EXPECT_FALSE(train(overlap, 2, 1, "bf16").passed);
  }
}

// Two layers, of which forward uses only the first when `skip_second` is set.
struct PartlyUsed : nn::Module {
  PartlyUsed() {
    first = register_module("first", std::make_shared<nn::Linear>(4, 1, Device::cpu, 1));
    second = register_module("second", std::make_shared<nn::Linear>(4, 1, Device::cpu, 2));
  }
  Tensor forward(const Tensor& x) override { return skip_second ? (*first)(x) : add((*first)(x), (*second)(x)); }
  std::shared_ptr<nn::Linear> first, second;
  bool skip_second = true;
};

// An assignment of another hand (chapter 05's exercise) that would all-reduce a gradient never or twice is
// refused when the buckets are built, the parameter named; a right one is used as given.
TEST(Reducer, AnAssignmentThatDropsOrRepeatsAParameterIsRefused) {
  using Buckets = std::vector<std::vector<std::size_t>>;
  // mlp()'s eight parameters: 0.weight, 0.bias, 2.weight, 2.bias, 4.weight, 4.bias, 6.weight, 6.bias.
  const std::vector<std::pair<Buckets, std::string>> wrong = {
      {{{7, 6, 5, 4, 3, 2, 1}}, "leaves out '0.weight'"},
      {{{7, 6, 5}, {4, 3, 2, 1, 0, 3}}, "puts '2.bias' in two buckets"},
      {{{7, 6, 5, 4, 3, 2, 1, 0}, {}}, "an empty bucket"},
      {{{7, 6, 5, 4, 3, 2, 1, 0, 8}}, "names parameter 8 of 8"}};
  for (const auto& [buckets, message] : wrong) {
    parallel::ReducerOptions options;
    options.assign_buckets = [&buckets = buckets](auto&&...) { return buckets; };
    try {
      parallel::DistributedDataParallel ddp(mlp(1), world(), options);
      ADD_FAILURE() << "accepted an assignment that should say: " << message;
    } catch (const std::logic_error& e) {
      EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
    }
  }
  parallel::ReducerOptions options;
  options.assign_buckets = [](auto&&...) { return Buckets{{7, 5}, {6, 4, 3, 2, 1, 0}}; };
  parallel::DistributedDataParallel ddp(mlp(1), world(), options);
  ASSERT_EQ(ddp.reducer().buckets().size(), 2u);
  EXPECT_EQ(ddp.reducer().buckets()[0].parameters, (std::vector<std::size_t>{7, 5}));
  EXPECT_EQ(ddp.reducer().buckets()[1].parameters, (std::vector<std::size_t>{6, 4, 3, 2, 1, 0}));
}

TEST(Reducer, AnUnusedParameterIsAnErrorOrZero) {
  Tensor x = Tensor::randn({3, 4}, 7);
  {
    auto model = std::make_shared<PartlyUsed>();
    parallel::DistributedDataParallel ddp(model, world());
    try {
      sum(ddp(x)).backward();
      ADD_FAILURE() << "an unused parameter was not reported";
    } catch (const std::logic_error& e) {
      EXPECT_NE(std::string(e.what()).find("'second.weight'"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("find_unused_parameters"), std::string::npos) << e.what();
    }
  }
  parallel::ReducerOptions options;
  options.find_unused_parameters = true;
  auto model = std::make_shared<PartlyUsed>();
  parallel::DistributedDataParallel ddp(model, world(), options);
  for (int step = 0; step < 3; ++step) {  // before and after the rebuild
    model->zero_grad();
    Tensor input = Tensor::full({3, 4}, static_cast<float>(world().rank() + 1));
    sum(ddp(input)).backward();
    // d/dW of sum(x W^T + b) is the column sums of x: 3 * (r + 1) on rank r, averaged over the ranks.
    const float expected = 3.0f * static_cast<float>(world().size() + 1) / 2.0f;
    EXPECT_EQ(model->first->weight.grad().to_host(), std::vector<float>(4, expected));
    EXPECT_EQ(model->second->weight.grad().to_host(), std::vector<float>(4, 0.0f));
  }
}

}  // namespace
}  // namespace course::testing

COURSE_MPI_TEST_MAIN()
