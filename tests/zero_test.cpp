// ZeRO stages 0-3 under mpirun with 1, 2, 3 and 4 ranks: the flat layout pads and partitions any size;
// stage 0 on one rank is optim::Adam (AdamW) bit for bit; stages 1, 2 and 3 end where stage 0 ends, with
// gradient accumulation and clipping, for the MLP and the GPT; and each stage's model states take the
// memory the ZeRO paper's formulas say, with the whole gradients (stage 2) and the whole parameters
// (stage 3) never alive at once.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <cstdlib>
#include <filesystem>
#include <optional>

#include "common/checkpoint/safetensors.h"
#include "common/checkpoint/sharded.h"
#include "common/comm/agree.h"
#include "common/core/errors.h"
#include "common/nn/gpt.h"
#include "common/nn/layers.h"
#include "common/ops/autocast.h"
#include "common/ops/ops.h"
#include "common/optim/optimizer.h"
#include "common/parallel/zero.h"
#include "common/parallel/zero_checkpoint.h"
#include "common/verify/compare.h"
#include "support/mpi_main.h"

namespace course::testing {
namespace {

constexpr double kLr = 1e-2;
constexpr int kSteps = 4;
const double kStageTolerance = verify::short_run_tolerance(kLr, kSteps);  // its reason is in verify/compare.h
constexpr double kFormulaTolerance = 0.05;  // the 5%: padding adds at most N-1 elements per unit

TEST(FlatLayout, PadsEveryUnitAndCoversEveryElementOnce) {
  std::vector<Tensor> params{Tensor::zeros({7}), Tensor::zeros({3, 5}), Tensor::zeros({1}), Tensor::zeros({11})};
  for (int shards = 1; shards <= 8; ++shards)
    for (std::int64_t cap : {1, 12, 1000}) {
      parallel::FlatLayout layout(params, shards, cap);
      std::vector<int> seen(34, 0);  // 7 + 15 + 1 + 11 elements
      std::int64_t shard_total = 0;
      for (std::size_t u = 0; u < layout.units().size(); ++u) {
        const auto& unit = layout.units()[u];
        EXPECT_EQ(unit.padded % shards, 0);
        EXPECT_LT(unit.padded - unit.numel, shards);
        shard_total += unit.part;
        for (int r = 0; r < shards; ++r)
          for (const auto& s : layout.segments(u, r)) {
            std::int64_t base = 0;
            for (std::size_t p = 0; p < s.param; ++p) base += params[p].numel();
            for (std::int64_t e = 0; e < s.length; ++e) ++seen[static_cast<std::size_t>(base + s.param_offset + e)];
          }
      }
      for (int count : seen) EXPECT_EQ(count, 1) << shards << " shards, cap " << cap;
      EXPECT_EQ(shard_total * shards, layout.padded());
    }
}

struct TrainingRun {
  int stage = 0;
  bool gpt = false;
  int accum = 1;
  double clip = 0;
  double unit_cap_mb = 0;  // 0: a unit per layer
  int steps = kSteps;
  bool prefetch = false;
  DType precision = DType::float32;
  parallel::ZeroOptions::Offload offload = parallel::ZeroOptions::Offload::none;
};

struct Result {
  std::vector<float> parameters;
  std::vector<float> losses;
};

// This rank's share of a fixed global batch, in `accum` micro-batches each weighted by its share of
// the rank's batch, so the average over ranks of the summed gradients is the global batch's gradient.
Result train(const TrainingRun& run) {
  comm::Communicator& group = world();
  const int ranks = group.size(), rank = group.rank();
  constexpr std::int64_t kGlobalBatch = 24;  // divisible by 1, 2, 3 and 4 ranks, and by 2 micro-batches
  const std::int64_t share = kGlobalBatch / ranks, micro = share / run.accum;
  std::shared_ptr<nn::Module> model;
  std::function<Tensor(std::int64_t first, std::int64_t count)> loss;
  if (run.gpt) {
    nn::GPTConfig c;
    c.n_layer = 2, c.n_head = 2, c.n_embd = 16, c.block_size = 8, c.vocab_size = 11;
    model = std::make_shared<nn::GPT>(c, Device::cpu, 3);
    loss = [model](std::int64_t first, std::int64_t count) {
      std::vector<float> ids, targets;
      for (std::int64_t i = first * 8; i < (first + count) * 8; ++i) {
        ids.push_back(static_cast<float>((i * 7 + 3) % 11));
        targets.push_back(static_cast<float>((i * 5 + 2) % 11));
      }
      return cross_entropy((*model)(Tensor::from_host(ids, {count, 8})), Tensor::from_host(targets, {count * 8}));
    };
  } else {
    model = nn::make_mlp(6, 32, 2, 1, nn::Activation::gelu, Device::cpu, 3);
    Tensor x = Tensor::randn({kGlobalBatch, 6}, 5), y = Tensor::randn({kGlobalBatch, 1}, 6);
    loss = [model, x, y](std::int64_t first, std::int64_t count) {
      return mse_loss((*model)(narrow(x, first, count)), narrow(y, first, count));
    };
  }
  parallel::ZeroOptions options;
  options.stage = run.stage;
  options.lr = static_cast<float>(kLr);
  options.weight_decay = 0.1f;
  options.max_grad_norm = run.clip;
  options.unit_cap_mb = run.unit_cap_mb;
  options.prefetch = run.prefetch;
  options.precision = run.precision;
  options.offload = run.offload;
  parallel::ZeroOptimizer zero(*model, group, options);
  Result result;
  for (int step = 0; step < run.steps; ++step) {
    double total = 0;
    for (int m = 0; m < run.accum; ++m) {
      Tensor l;
      {
        Autocast autocast(run.precision);  // float32: off
        l = scale(loss(rank * share + m * micro, micro), 1.0f / static_cast<float>(run.accum));
      }
      total += l.item();
      zero.mixed_precision().backward(l);
    }
    Tensor mean_loss = Tensor::from_host({static_cast<float>(total)}, {1});
    group.all_reduce(mean_loss, comm::ReduceOp::average);
    result.losses.push_back(mean_loss.item());
    zero.step();
    zero.zero_grad();
  }
  result.parameters = zero.full_parameters();
  return result;
}

// Another hand's pieces (chapter 07's exercise 07.1) that reach outside a parameter or the rank's part are
// refused before AdamW writes through them, naming the unit and the rank.
TEST(Zero, OwnedPiecesOutsideTheirParameterOrPartAreRefused) {
  auto model = nn::make_mlp(6, 32, 2, 1, nn::Activation::gelu, Device::cpu, 3);
  parallel::ZeroOptions options;
  options.stage = 1;
  options.owned_segments = [](const std::vector<std::int64_t>& numels, std::int64_t part, int) {
    return std::vector<parallel::FlatSegment>{{0, 0, 0, std::min(numels[0], part) + 1}};  // every rank, one too long
  };
  parallel::ZeroOptimizer zero(*model, world(), options);
  sum((*model)(Tensor::randn({4, 6}, 1))).backward();
  try {
    zero.step();
    ADD_FAILURE() << "a piece one element too long was used";
  } catch (const std::logic_error& e) {
    const std::string named = "rank " + std::to_string(world().rank()) + " a piece outside its parameter or its part";
    EXPECT_NE(std::string(e.what()).find(named), std::string::npos) << e.what();
  }
}

TEST(Zero, StageZeroOnOneRankIsAdamWBitForBit) {
  // Every rank alone, in a group of its own, at any world size.
  auto alone = world().split(world().rank(), 0);
  auto model = nn::make_mlp(6, 32, 2, 1, nn::Activation::gelu, Device::cpu, 3);
  auto reference = nn::make_mlp(6, 32, 2, 1, nn::Activation::gelu, Device::cpu, 3);
  parallel::ZeroOptions options;
  options.stage = 0;
  options.lr = 1e-2f;
  options.weight_decay = 0.1f;
  parallel::ZeroOptimizer zero(*model, *alone, options);
  optim::Adam adamw(optim::weight_decay_groups(reference->parameters(), 0.1f), 1e-2f, 0.9f, 0.999f, 1e-8f, true);
  Tensor x = Tensor::randn({24, 6}, 5), y = Tensor::randn({24, 1}, 6);
  for (int step = 0; step < 5; ++step) {
    mse_loss((*model)(x), y).backward();
    zero.step();
    zero.zero_grad();
    mse_loss((*reference)(x), y).backward();
    adamw.step();
    adamw.zero_grad();
  }
  const auto a = model->parameters_to_host(), b = reference->parameters_to_host();
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
}

class ZeroStages : public ::testing::TestWithParam<TrainingRun> {};

TEST_P(ZeroStages, EndWhereStageZeroEnds) {
  TrainingRun run = GetParam();
  TrainingRun reference = run;
  reference.stage = 0;
  const Result expected = train(reference), got = train(run);
  ASSERT_EQ(got.parameters.size(), expected.parameters.size());
  EXPECT_LE(verify::max_abs_diff(got.parameters, expected.parameters), kStageTolerance);
  EXPECT_LE(verify::max_abs_diff(got.losses, expected.losses), kStageTolerance);
  // And every rank holds the same parameters.
  Tensor mine = Tensor::from_host(got.parameters, {static_cast<std::int64_t>(got.parameters.size())});
  Tensor first = mine.clone();
  world().broadcast(first, 0);
  EXPECT_EQ(verify::max_abs_diff(mine.to_host(), first.to_host()), 0.0);
}

// Units: one per layer (cap 0, the default), one for the whole model (25 MB), or many small ones cut
// across layers (1e-3 MB is 262 floats), most of them split unevenly across ranks.
INSTANTIATE_TEST_SUITE_P(AllStages, ZeroStages,
                         ::testing::Values(TrainingRun{1, false, 1, 0, 0}, TrainingRun{2, false, 1, 0, 25},
                                           TrainingRun{3, false, 1, 0, 0}, TrainingRun{1, false, 2, 0.05, 1e-3},
                                           TrainingRun{2, false, 2, 0.05, 1e-3}, TrainingRun{3, false, 2, 0.05, 0},
                                           TrainingRun{1, true, 1, 0.5, 0}, TrainingRun{2, true, 2, 0.5, 0.01},
                                           TrainingRun{3, true, 1, 0, 0}, TrainingRun{3, true, 2, 0.5, 0},
                                           TrainingRun{2, true, 1, 0, 0}),
                         [](const ::testing::TestParamInfo<TrainingRun>& info) {
                           const TrainingRun& r = info.param;
                           return std::string(r.gpt ? "gpt" : "mlp") + "_stage" + std::to_string(r.stage) + "_accum" +
                                  std::to_string(r.accum) + (r.clip > 0 ? "_clipped" : "") +
                                  (r.unit_cap_mb == 0 ? "_layer_units" : r.unit_cap_mb < 1 ? "_small_units" : "_one_unit");
                         });

// Prefetching moves when each unit is gathered, never what is gathered: the same bits, with and without,
// through accumulation and clipping.
TEST(Zero, StageThreePrefetchChangesOnlyTheTiming) {
  for (bool gpt : {false, true}) {
    TrainingRun run{3, gpt, 2, 0.5, 0};
    const Result plain = train(run);
    run.prefetch = true;
    const Result prefetched = train(run);
    EXPECT_EQ(prefetched.parameters, plain.parameters) << (gpt ? "gpt" : "mlp");
    EXPECT_EQ(prefetched.losses, plain.losses) << (gpt ? "gpt" : "mlp");
  }
}

// Model states per rank against the formulas (AdamW, Ψ parameters, N ranks), split by category. float32:
// 16Ψ, 8Ψ + 8Ψ/N, 4Ψ + 12Ψ/N, 16Ψ/N; mixed precision (bfloat16 parameters and gradients, float32
// masters beside Adam's moments, the paper's K = 12): 16Ψ, 4Ψ + 12Ψ/N, 2Ψ + 14Ψ/N, 16Ψ/N. Measured after
// a step, and at the step's peak for what is sharded: stage 2's gradients, stage 3's gradients and
// parameters (gathered units are communication buffers, and they too stay well below the whole model).
TEST(Zero, ModelStatesTakeWhatTheFormulasSay) {
  const int n = world().size();
  for (DType precision : {DType::float32, DType::bfloat16})
  for (int stage = 0; stage <= 3; ++stage) {
    SCOPED_TRACE(std::string(dtype_name(precision)) + " stage " + std::to_string(stage));
    const bool mixed = precision != DType::float32;
    const double bytes = mixed ? 2 : 4;  // per parameter and per gradient
    // Many small layers (the largest weight a twelfth of the model), so units can be small.
    auto model = nn::make_mlp(16, 32, 12, 1, nn::Activation::relu, Device::cpu, 4);
    const double psi = static_cast<double>(model->parameter_count());
    const auto before = memory_stats(Device::cpu);
    parallel::ZeroOptions options;
    options.stage = stage;
    options.precision = precision;
    options.unit_cap_mb = psi * 4 / 16 / (1024.0 * 1024.0);  // about one layer per unit
    std::optional<parallel::ZeroOptimizer> zero(std::in_place, *model, world(), options);
    Tensor x = Tensor::randn({24, 16}, 1), y = Tensor::randn({24, 1}, 2);
    reset_peak_memory(Device::cpu);
    {
      Autocast autocast(precision, mixed);
      mse_loss((*model)(x), y).backward();
    }
    zero->step();
    const auto after = memory_stats(Device::cpu);
    auto grown = [&](MemoryCategory c) {
      return static_cast<double>(after.current_of(c) - before.current_of(c));
    };
    const double grads_formula = stage <= 1 ? bytes * psi : bytes * psi / n;
    const double params_formula = stage <= 2 ? bytes * psi : bytes * psi / n;
    const double optimizer_bytes = mixed ? 12 : 8;  // Adam's moments, and in mixed precision the masters
    const double adam_formula = stage == 0 ? optimizer_bytes * psi : optimizer_bytes * psi / n;
    // The model's own parameter tensors were freed when they moved into the flat buffer.
    EXPECT_NEAR(static_cast<double>(after.current_of(MemoryCategory::parameters)) / params_formula, 1.0,
                kFormulaTolerance);
    EXPECT_NEAR(grown(MemoryCategory::gradients) / grads_formula, 1.0, kFormulaTolerance);
    EXPECT_NEAR(grown(MemoryCategory::optimizer_state) / adam_formula, 1.0, kFormulaTolerance);
    for (const Tensor& p : model->parameters()) EXPECT_EQ(p.dtype(), precision);
    // Communication per rank, as a ring sends it: 2Ψ elements at stages 0-2, 3Ψ at stage 3 (this
    // model has no root unit: every parameter is in a Linear, gathered for forward and for backward),
    // of the parameters' type.
    const double ring_formula = (stage == 3 ? 3 : 2) * bytes * psi * (n - 1) / n;
    if (n == 1) EXPECT_EQ(zero->ring_bytes_last_step(), 0);
    else EXPECT_NEAR(static_cast<double>(zero->ring_bytes_last_step()) / ring_formula, 1.0, kFormulaTolerance);
    if (stage >= 2) {
      // Gradients never exceed the shard, and the units in flight (at most two, and one parameter's own
      // gradient) stay below half of the whole model's gradients; in mixed precision the update's
      // float32 copy of this rank's gradients comes on top, for the update's duration.
      EXPECT_LE(static_cast<double>(after.peak_of(MemoryCategory::gradients) - before.current_of(MemoryCategory::gradients)) /
                    grads_formula,
                1.0 + kFormulaTolerance);
      if (stage == 3) {
        EXPECT_LE(static_cast<double>(after.peak_of(MemoryCategory::parameters)) / params_formula,
                  1.0 + kFormulaTolerance);
      }
      if (n > 1) {
        EXPECT_LT(static_cast<double>(after.peak_of(MemoryCategory::communication) -
                                      before.current_of(MemoryCategory::communication)),
                  0.5 * bytes * psi + (mixed ? 4 * psi / n * (1 + kFormulaTolerance) : 0));
      }
    }
    zero.reset();
    model.reset();
  }
}

// ZeRO-Offload (Ren et al. 2021) moves where the optimizer's state lives and where AdamW runs, never
// what it computes: the same parameters and losses, bit for bit, at every stage, in float32 and in both
// 16-bit formats (float16's loss scale included), through accumulation and clipping, for the MLP and the
// GPT in bfloat16 (whose root unit, the embeddings, stage 3 gathers for the whole step).
TEST(Zero, OffloadingChangesNoBit) {
  using Offload = parallel::ZeroOptions::Offload;
  for (const auto& [gpt, precision] : std::vector<std::pair<bool, DType>>{
           {false, DType::float32}, {false, DType::float16}, {true, DType::bfloat16}})
  for (int stage = 0; stage <= 3; ++stage) {
    TrainingRun run{stage, gpt, 2, 0.5, 0};
    run.precision = precision;
    const Result plain = train(run);
    for (Offload offload : {Offload::optimizer, Offload::parameters}) {
      if (offload == Offload::parameters && stage != 3) continue;
      SCOPED_TRACE(std::string(gpt ? "gpt " : "mlp ") + dtype_name(precision) + " stage " + std::to_string(stage) +
                   " offload " + parallel::offload_name(offload));
      run.offload = offload;
      const Result offloaded = train(run);
      EXPECT_EQ(offloaded.parameters, plain.parameters);
      EXPECT_EQ(offloaded.losses, plain.losses);
    }
  }
}

TEST(Zero, OffloadingTheParametersNeedsStageThree) {
  auto model = nn::make_mlp(6, 32, 2, 1, nn::Activation::gelu, Device::cpu, 3);
  parallel::ZeroOptions options;
  options.offload = parallel::ZeroOptions::Offload::parameters;
  for (int stage = 0; stage <= 2; ++stage) {
    options.stage = stage;
    EXPECT_THROW(parallel::ZeroOptimizer(*model, world(), options), std::invalid_argument) << stage;
  }
}

// Where each byte is with offloading, against ZeRO-Offload's accounting (b bytes a parameter or
// gradient: 2 in 16 bits, 4 in float32). The device keeps the parameters (stage 3: its part, or with the
// parameters offloaded none but the units it gathers) and at stages 0-1 the gradients; the host keeps
// the float32 masters and Adam's moments (12 bytes a parameter, this rank's part), at stages 2-3 this
// rank's part of the gradients, and with the parameters offloaded in 16 bits their part too (in float32
// the masters are that part). A step moves b bytes a parameter of this rank's part down (gradients) and
// up (parameters); with the parameters offloaded, each unit's part goes up for forward and for backward.
TEST(Zero, OffloadedStatesTakeWhatTheFormulasSay) {
  using Offload = parallel::ZeroOptions::Offload;
  const int n = world().size();
  for (DType precision : {DType::float32, DType::bfloat16})
  for (int stage = 0; stage <= 3; ++stage)
  for (Offload offload : {Offload::optimizer, Offload::parameters}) {
    if (offload == Offload::parameters && stage != 3) continue;
    SCOPED_TRACE(std::string(dtype_name(precision)) + " stage " + std::to_string(stage) + " offload " +
                 parallel::offload_name(offload));
    const bool mixed = precision != DType::float32, params_off = offload == Offload::parameters;
    const double b = mixed ? 2 : 4;
    auto model = nn::make_mlp(16, 32, 12, 1, nn::Activation::relu, Device::cpu, 4);
    const double psi = static_cast<double>(model->parameter_count());
    const double part = stage == 0 ? psi : psi / n;  // what this rank's optimizer updates
    const auto before = memory_stats(Device::cpu);
    parallel::ZeroOptions options;
    options.stage = stage;
    options.precision = precision;
    options.offload = offload;
    std::optional<parallel::ZeroOptimizer> zero(std::in_place, *model, world(), options);
    Tensor x = Tensor::randn({24, 16}, 1), y = Tensor::randn({24, 1}, 2);
    {
      Autocast autocast(precision);
      mse_loss((*model)(x), y).backward();
    }
    zero->step();
    const auto after = memory_stats(Device::cpu);
    auto grown = [&](MemoryCategory c) { return static_cast<double>(after.current_of(c) - before.current_of(c)); };
    auto near = [&](double measured, double formula) {
      if (formula == 0) {
        EXPECT_EQ(measured, 0);
      } else {
        EXPECT_NEAR(measured / formula, 1.0, kFormulaTolerance);
      }
    };
    near(static_cast<double>(after.current_of(MemoryCategory::parameters)),
         params_off ? 0 : stage <= 2 ? b * psi : b * psi / n);
    near(grown(MemoryCategory::gradients), stage <= 1 ? b * psi : 0);
    near(grown(MemoryCategory::optimizer_state), 0);
    near(grown(MemoryCategory::offloaded),
         12 * part + (stage >= 2 ? b * part : 0) + (params_off && mixed ? b * part : 0));
    // The host's bytes are outside the device's totals (on a CPU-only run the host is the device).
    EXPECT_EQ(static_cast<double>(after.current_total - before.current_total),
              grown(MemoryCategory::parameters) + grown(MemoryCategory::gradients) +
                  grown(MemoryCategory::optimizer_state) + grown(MemoryCategory::communication) +
                  grown(MemoryCategory::activations));
    const auto traffic = zero->host_traffic_last_step();
    near(static_cast<double>(traffic.down), b * part);
    near(static_cast<double>(traffic.up), (params_off ? 2 : 1) * b * part);
    zero.reset();
    model.reset();
  }
}

// Mixed precision on one rank, stage 0, is AdamW on float32 masters bit for bit (Micikevicius et al.
// 2018): each step the model computes with the masters' 16-bit roundings under autocast, float16's loss
// is scaled and its gradients unscaled in float32, and the masters take AdamW's update. The reference
// does exactly that with a float32 model, a 16-bit copy of it (Module::to) and optim::Adam.
TEST(Zero, MixedStageZeroOnOneRankIsAdamWOnFloat32MastersBitForBit) {
  auto alone = world().split(world().rank(), 0);
  for (DType dtype : {DType::bfloat16, DType::float16}) {
    SCOPED_TRACE(dtype_name(dtype));
    const float loss_scale = dtype == DType::float16 ? 1024.0f : 1.0f;
    auto model = nn::make_mlp(6, 32, 2, 1, nn::Activation::gelu, Device::cpu, 3);
    auto masters = nn::make_mlp(6, 32, 2, 1, nn::Activation::gelu, Device::cpu, 3);
    auto working = nn::make_mlp(6, 32, 2, 1, nn::Activation::gelu, Device::cpu, 3);
    working->to(dtype);
    parallel::ZeroOptions options;
    options.stage = 0;
    options.lr = 1e-2f;
    options.weight_decay = 0.1f;
    options.precision = dtype;
    options.init_scale = loss_scale;
    parallel::ZeroOptimizer zero(*model, *alone, options);
    optim::Adam adamw(optim::weight_decay_groups(masters->parameters(), 0.1f), 1e-2f, 0.9f, 0.999f, 1e-8f, true);
    Tensor x = Tensor::randn({24, 6}, 5), y = Tensor::randn({24, 1}, 6);
    for (int step = 0; step < 5; ++step) {
      {
        Autocast autocast(dtype);
        zero.mixed_precision().backward(mse_loss((*model)(x), y));
      }
      zero.step();
      zero.zero_grad();
      working->load_parameters_from_host(masters->parameters_to_host());  // rounded to 16 bits
      working->zero_grad();
      {
        Autocast autocast(dtype);
        scale(mse_loss((*working)(x), y), loss_scale).backward();
      }
      const auto w = working->parameters(), m = masters->parameters();
      for (std::size_t i = 0; i < m.size(); ++i) {
        std::vector<float> g = w[i].grad().to_host();
        for (float& v : g) v *= 1.0f / loss_scale;
        Tensor master = m[i];
        master.set_grad(Tensor::from_host(g, m[i].shape()));
      }
      adamw.step();
      adamw.zero_grad();
    }
    EXPECT_EQ(model->parameters().front().dtype(), dtype);
    const auto a = zero.full_parameters(), b = masters->parameters_to_host();
    ASSERT_EQ(a.size(), b.size());
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
    working->load_parameters_from_host(b);
    EXPECT_EQ(model->parameters_to_host(), working->parameters_to_host());  // the masters' roundings
    EXPECT_EQ(zero.steps_taken(), 5);
  }
}

// float16 with a loss scale far too large: the gradients overflow, every rank skips the step (the
// parameters untouched, the scale halved, nothing counted as Adam's step), until the scale has come
// down and training goes on.
TEST(Zero, AnOverflowingFloat16StepIsSkippedByEveryRank) {
  for (int stage : {0, 1, 3}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    auto model = nn::make_mlp(6, 32, 2, 1, nn::Activation::gelu, Device::cpu, 3);
    parallel::ZeroOptions options;
    options.stage = stage;
    options.precision = DType::float16;
    options.init_scale = 0x1p40f;
    parallel::ZeroOptimizer zero(*model, world(), options);
    Tensor x = Tensor::randn({24, 6}, 5 + world().rank()), y = Tensor::randn({24, 1}, 6);
    const auto initial = zero.full_parameters();
    auto train_step = [&] {
      {
        Autocast autocast(DType::float16);
        zero.mixed_precision().backward(mse_loss((*model)(x), y));
      }
      const double norm = zero.step();
      zero.zero_grad();
      return norm;
    };
    EXPECT_TRUE(std::isinf(train_step()));
    EXPECT_EQ(zero.full_parameters(), initial);
    EXPECT_EQ(zero.scaler().skipped_steps(), 1);
    EXPECT_EQ(zero.scaler().get_scale(), 0x1p39f);
    EXPECT_EQ(zero.steps_taken(), 0);
    for (int step = 1; step < 40; ++step) train_step();
    EXPECT_GT(zero.steps_taken(), 0);
    EXPECT_EQ(zero.steps_taken() + zero.scaler().skipped_steps(), 40);
    EXPECT_NE(zero.full_parameters(), initial);
    // Every rank skipped the same steps.
    EXPECT_EQ(comm::all_reduce_scalar(world(), static_cast<float>(zero.steps_taken()), comm::ReduceOp::max),
              static_cast<float>(zero.steps_taken()));
  }
}

// Sharded checkpoints (checkpoint/sharded.h, parallel/zero_checkpoint.h) on their own: every rank writes
// its shard and rank 0 the index; the folder keeps the newest --keep; a fresh model and optimizer
// resumed from it hold the same state and take the same next step, bit for bit; another setting is
// refused naming its flag; consolidation puts the shards back into whole tensors under their names; a
// step folder without an index is incomplete and removed.
TEST(ShardedCheckpoint, SavesKeepsResumesConsolidates) {
  comm::Communicator& group = world();
  std::string dir;
  if (group.rank() == 0) {
    char pattern[] = "/tmp/sharded_test_XXXXXX";
    ASSERT_NE(::mkdtemp(pattern), nullptr);
    dir = pattern;
  }
  comm::broadcast_string(group, dir, 0);
  const std::string folder_path = dir + "/ckpt";
  Tensor x = Tensor::randn({24, 6}, 5), y = Tensor::randn({24, 1}, 6);
  const std::int64_t share = 24 / group.size();
  auto step_once = [&](nn::Module& model, parallel::ZeroOptimizer& zero) {
    mse_loss(model(narrow(x, group.rank() * share, share)), narrow(y, group.rank() * share, share)).backward();
    zero.step();
    zero.zero_grad();
  };
  parallel::ZeroOptions options;
  options.stage = 3;
  options.lr = 1e-2f;
  auto model = nn::make_mlp(6, 32, 2, 1, nn::Activation::gelu, Device::cpu, 3);
  parallel::ZeroOptimizer zero(*model, group, options);
  const checkpoint::ShardedFolder folder(folder_path, 2);
  const checkpoint::Metadata settings{{"stage", "3"}, {"lr", "0.01"}};
  std::vector<float> at_three;
  for (std::int64_t step = 1; step <= 3; ++step) {
    step_once(*model, zero);
    parallel::save_zero_checkpoint(folder, group, zero, *model, step, settings);
  }
  at_three = zero.full_parameters();
  EXPECT_TRUE(folder.has_checkpoints());
  EXPECT_EQ(folder.latest_complete(), std::optional<std::int64_t>(3));
  EXPECT_EQ(folder.complete_steps(), (std::vector<std::int64_t>{3, 2}));  // --keep 2: step 1 is gone

  auto other = nn::make_mlp(6, 32, 2, 1, nn::Activation::gelu, Device::cpu, 99);  // another initialisation
  parallel::ZeroOptimizer resumed(*other, group, options);
  EXPECT_EQ(parallel::resume_zero_checkpoint(folder, group, resumed, settings), 3);
  EXPECT_EQ(resumed.full_parameters(), at_three);
  step_once(*model, zero);
  step_once(*other, resumed);
  EXPECT_EQ(resumed.full_parameters(), zero.full_parameters()) << "the moments did not come back whole";
  EXPECT_THROW(parallel::resume_zero_checkpoint(folder, group, resumed, {{"stage", "2"}, {"lr", "0.01"}}), UsageError);

  if (group.rank() == 0) {
    const std::string whole = dir + "/whole.safetensors";
    checkpoint::consolidate(folder.step_dir(3), whole);
    const auto loaded = checkpoint::load_safetensors(whole);
    const auto named = model->named_parameters();
    ASSERT_EQ(loaded.tensors.size(), named.size());
    std::vector<float> flat;
    for (std::size_t i = 0; i < named.size(); ++i) {
      EXPECT_EQ(loaded.tensors[i].first, named[i].first);
      EXPECT_EQ(loaded.tensors[i].second.shape(), named[i].second.shape());
      const auto v = loaded.tensors[i].second.to_host();
      flat.insert(flat.end(), v.begin(), v.end());
    }
    EXPECT_EQ(flat, at_three);
    std::filesystem::create_directories(folder.step_dir(7));  // a writer that died before its index
  }
  group.barrier();
  EXPECT_EQ(folder.latest_complete(), std::optional<std::int64_t>(3));
  group.barrier();  // every rank has looked before rank 0 removes the folder
  if (group.rank() == 0) {
    EXPECT_EQ(folder.remove_incomplete().size(), 1u);
    EXPECT_FALSE(std::filesystem::exists(folder.step_dir(7)));
    std::filesystem::remove_all(dir);
  }
  group.barrier();
}

TEST(Zero, AStageOutsideZeroToThreeIsRefused) {
  auto model = nn::make_mlp(2, 4, 1, 1, nn::Activation::relu, Device::cpu, 1);
  for (int stage : {-1, 4, 7}) {
    parallel::ZeroOptions options;
    options.stage = stage;
    EXPECT_THROW(parallel::ZeroOptimizer(*model, world(), options), std::invalid_argument);
  }
}

}  // namespace
}  // namespace course::testing

COURSE_MPI_TEST_MAIN()
