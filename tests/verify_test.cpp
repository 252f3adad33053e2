// The verification's tolerances (common/verify/compare.h) tested directly: random sums added in random
// orders in float32 stay within the derived bound, and the same sums with a doubled scale do not; a
// norm from float32 partial sums stays within its bound, and one that counts a part twice does not;
// the noise-floor rule pools the floors of tiny tensors. Then the lock-step check itself
// (common/verify/lockstep.h) on one process: a correct run passes every step, and a wrong gradient, a
// wrong loss, a wrong update or a wrong start fails at the step where it begins, named.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "common/kernels/half.h"
#include "common/nn/layers.h"
#include "common/ops/autocast.h"
#include "common/ops/ops.h"
#include "common/optim/optimizer.h"
#include "common/faults/faults.h"
#include "common/verify/compare.h"
#include "common/verify/lockstep.h"
#include "common/verify/reference_optimizer.h"

namespace course::testing {
namespace {

// R parts of n terms each, of mixed signs and magnitudes.
std::vector<std::vector<float>> random_parts(std::mt19937& rng, int parts, int n) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> exponent(-6.0f, 3.0f);
  std::vector<std::vector<float>> out(static_cast<std::size_t>(parts), std::vector<float>(static_cast<std::size_t>(n)));
  for (auto& part : out)
    for (float& x : part) x = normal(rng) * std::pow(10.0f, exponent(rng));
  return out;
}

TEST(SummationBound, RandomSumsInRandomOrdersStayWithinIt) {
  std::mt19937 rng(7);
  int checked = 0;
  for (int trial = 0; trial < 200; ++trial) {
    const int parts = 2 + trial % 15;
    const auto terms = random_parts(rng, parts, 64);
    const double scale = 1.0 / parts;  // DDP's average
    for (std::size_t i = 0; i < 64; ++i) {
      std::vector<int> order(static_cast<std::size_t>(parts));
      std::iota(order.begin(), order.end(), 0);
      std::shuffle(order.begin(), order.end(), rng);
      float sum = 0;  // the run: float32 additions in some order, then the scaling
      double exact = 0, magnitude = 0;
      for (int r : order) sum += terms[static_cast<std::size_t>(r)][i];
      for (int r = 0; r < parts; ++r) {
        exact += scale * terms[static_cast<std::size_t>(r)][i];
        magnitude += std::fabs(scale * terms[static_cast<std::size_t>(r)][i]);
      }
      const float computed = sum * static_cast<float>(scale);
      const double bound = verify::summation_bound(magnitude, parts + 1);
      EXPECT_LE(std::fabs(computed - exact), bound) << "trial " << trial << " element " << i;
      // Averaged twice (the scale doubled, or halved): far outside, unless the sum itself vanishes.
      if (std::fabs(exact) > 10 * bound) {
        EXPECT_GT(std::fabs(2 * computed - exact), bound);
        EXPECT_GT(std::fabs(0.5f * computed - exact), bound);
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 1000);
}

TEST(SummationBound, SixteenBitPartsNeedTheirOwnUnitRoundoff) {
  // Parts rounded to bf16 before a float32 sum differ from the exact sum by far more than float32's
  // bound allows, and stay within bf16's.
  std::mt19937 rng(3);
  const auto terms = random_parts(rng, 4, 256);
  double worst_float = 0, worst_bf16 = 0;
  for (std::size_t i = 0; i < 256; ++i) {
    double exact = 0, magnitude = 0;
    float sum = 0;
    for (const auto& part : terms) {
      exact += part[i];
      magnitude += std::fabs(part[i]);
      std::uint32_t bits;
      std::memcpy(&bits, &part[i], 4);
      bits = (bits + 0x7fff + ((bits >> 16) & 1)) & 0xffff0000u;  // round to nearest even, to bf16
      float rounded;
      std::memcpy(&rounded, &bits, 4);
      sum += rounded;
    }
    const double diff = std::fabs(sum - exact);
    worst_float = std::max(worst_float, diff / verify::summation_bound(magnitude, 5));
    worst_bf16 = std::max(worst_bf16, diff / verify::summation_bound(magnitude, 6, verify::kBfloat16Rounding));
  }
  EXPECT_GT(worst_float, 1.0);
  EXPECT_LE(worst_bf16, 1.0);
}

// A ring of three ranks adding bf16 parts (each rounded to bf16, then two bf16 additions), over 10^5
// elements, as a compression hook adds them; `convert` is the hook's conversion to bf16.
verify::RoundingBias bf16_ring_sum(const std::function<float(float)>& convert) {
  std::mt19937 rng(11);
  const auto terms = random_parts(rng, 3, 100000);
  const auto bf16 = [](float x) { return half::from_bfloat16(half::to_bfloat16(x)); };  // to nearest, ties to even
  verify::RoundingBias bias;
  for (std::size_t i = 0; i < terms[0].size(); ++i) {
    double exact = 0, magnitude = 0;
    float sum = 0;
    for (const auto& part : terms) {
      exact += part[i];
      magnitude += std::fabs(part[i]);
      sum = bf16(sum + convert(part[i]));
    }
    // The run's 3 + 1 roundings in bf16 and the reference's one in float32 (check_parts' bound).
    const double absolute = verify::summation_bound(0.0, 4, verify::kBfloat16Rounding) + verify::summation_bound(0.0, 1);
    const double bound = verify::summation_bound(magnitude, 4, verify::kBfloat16Rounding) + verify::summation_bound(magnitude, 1);
    const float reference = static_cast<float>(exact);
    EXPECT_LE(std::fabs(sum - static_cast<double>(reference)), bound) << i;  // truncation too stays within it
    bias.add(sum, reference, bound, absolute);
  }
  return bias;
}

TEST(RoundingBias, RoundingToNearestPassesAndATruncatingOrUpwardConversionFails) {
  const auto nearest = bf16_ring_sum([](float x) { return half::from_bfloat16(half::to_bfloat16(x)); });
  EXPECT_EQ(nearest.elements(), 100000);
  EXPECT_LT(nearest.ratio(), 0.5);
  const auto truncated = bf16_ring_sum([](float x) { return std::bit_cast<float>(std::bit_cast<std::uint32_t>(x) & 0xffff0000u); });
  EXPECT_GT(truncated.ratio(), 2.0);
  EXPECT_STREQ(truncated.direction(), "toward zero");
  const auto upward = bf16_ring_sum([](float x) {  // the bf16 at or above x: truncation below zero, one up above
    const std::uint32_t bits = std::bit_cast<std::uint32_t>(x), kept = bits & 0xffff0000u;
    return std::bit_cast<float>(x > 0 && kept != bits ? kept + 0x10000u : kept);
  });
  EXPECT_GT(upward.ratio(), 2.0);
  EXPECT_STREQ(upward.direction(), "upward");
}

// Values at the bottom of fp16's range all round toward zero, legitimately: their allowance covers it.
TEST(RoundingBias, UnderflowToZeroIsAllowed) {
  verify::RoundingBias bias;
  for (int i = 0; i < 100000; ++i) {
    const double x = 0x1p-27 * (1 + i % 7);  // below half fp16's smallest subnormal (2^-25): rounds to 0
    const double bound = verify::summation_bound(x, 2, verify::kFloat16Rounding);
    bias.add(0.0, x, bound, verify::summation_bound(0.0, 2, verify::kFloat16Rounding));
  }
  EXPECT_LE(bias.ratio(), 1.0);
  EXPECT_STREQ(bias.direction(), "toward zero");
}

TEST(NormBound, APartitionedNormStaysWithinItAndADoubleCountDoesNot) {
  std::mt19937 rng(11);
  for (int partials : {1, 2, 3, 4, 8}) {
    const auto parts = random_parts(rng, partials, 1000);
    double exact_squares = 0;
    float total = 0;  // each rank's sum of squares in double, sent in float32, added in float32
    for (const auto& part : parts) {
      double squares = 0;
      for (float g : part) squares += static_cast<double>(g) * g;
      exact_squares += squares;
      total += static_cast<float>(squares);
    }
    const double exact = std::sqrt(exact_squares), run = std::sqrt(static_cast<double>(total));
    EXPECT_LE(std::fabs(run - exact), verify::norm_bound(exact, partials)) << partials << " partial sums";
    // The first part counted twice (a tied table on two stages): outside.
    double first = 0;
    for (float g : parts[0]) first += static_cast<double>(g) * g;
    EXPECT_GT(std::fabs(std::sqrt(exact_squares + first) - exact), verify::norm_bound(exact, partials));
  }
}

// A floor that comes out near zero by chance is replaced by the largest of the item's last 16; a large one
// is forgotten 16 steps later; each item keeps its own.
TEST(NoiseFloor, EachFloorIsTheLargestOfItsLastSixteen) {
  verify::FloorHistory history;
  EXPECT_EQ(history.remember(0, 4.0), 4.0);
  EXPECT_EQ(history.remember(1, 1.0), 1.0);  // another item: its own history
  EXPECT_EQ(history.remember(0, 1e-12), 4.0);
  for (int step = 2; step < verify::kFloorHistory; ++step) EXPECT_EQ(history.remember(0, 2.0), 4.0) << step;
  EXPECT_EQ(history.remember(0, 2.0), 2.0);  // the 4 was 16 measurements ago
  EXPECT_EQ(history.remember(1, 0.5), 1.0);
  EXPECT_TRUE(std::isnan(history.remember(1, NAN)));  // a NaN floor is never hidden
}

TEST(NoiseFloor, SmallTensorsTakeThePooledFloorsAndNoneIsBelowOneRounding) {
  // Three large tensors with relative floors 1e-6, 2e-6 and 4e-6, and a one-element bias whose two
  // passes happened to agree.
  const std::vector<double> floors{1e-6, 2e-6, 4e-6, 0.0}, largest{1.0, 1.0, 1.0, 0.5};
  const auto tolerances = verify::noise_floor_tolerances(floors, largest, {4096, 4096, 4096, 1});
  ASSERT_EQ(tolerances.size(), 4u);
  EXPECT_DOUBLE_EQ(tolerances[0], verify::kNoiseFloorFactor * 2e-6);  // raised to the median
  EXPECT_DOUBLE_EQ(tolerances[2], verify::kNoiseFloorFactor * 4e-6);  // its own
  EXPECT_DOUBLE_EQ(tolerances[3], verify::kNoiseFloorFactor * 4e-6 * 0.5);  // small: the largest relative floor
  // Euclidean floors (the whole model's check) are steady from fewer elements: a 32-element bias keeps
  // its own floor there, where the float32 check's pooling would hold it to the largest relative floor.
  const std::vector<double> norms{1e-6, 2e-6, 4e-6, 3e-6, 0.0}, scales{1.0, 1.0, 1.0, 1.0, 0.5};
  const std::vector<std::int64_t> sizes{4096, 4096, 4096, 32, 8};
  const auto euclidean = verify::noise_floor_tolerances(norms, scales, sizes, verify::kWholeModelFloorFactor,
                                                        verify::kStableEuclideanFloorElements);
  EXPECT_DOUBLE_EQ(euclidean[3], verify::kWholeModelFloorFactor * 3e-6);        // its own
  EXPECT_DOUBLE_EQ(euclidean[4], verify::kWholeModelFloorFactor * 4e-6 * 0.5);  // under 16: the largest
  EXPECT_DOUBLE_EQ(verify::noise_floor_tolerances(norms, scales, sizes, verify::kWholeModelFloorFactor)[3],
                   verify::kWholeModelFloorFactor * 4e-6);
  // A model whose floors all vanished still allows one rounding of each tensor's largest gradient.
  const auto exact = verify::noise_floor_tolerances({0.0, 0.0}, {1.0, 8.0}, {1000, 1000});
  EXPECT_DOUBLE_EQ(exact[1], verify::kNoiseFloorFactor * 8.0 * verify::kUnitRoundoff);
  EXPECT_THROW(verify::noise_floor_tolerances({0.0}, {1.0, 2.0}, {1, 1}), std::invalid_argument);
}

// ---- the lock-step check on one process ------------------------------------------------------------

constexpr int kSteps = 6, kParts = 3;

std::shared_ptr<nn::Module> small_mlp() { return nn::make_mlp(4, 8, 1, 1, nn::Activation::gelu, Device::cpu, 3); }

Tensor inputs(int step, int part) {
  std::vector<float> x(2 * 4);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.7f * static_cast<float>(i + 13 * step + 5 * part));
  return Tensor::from_host(x, {2, 4});
}

// A check on one process whose reference steps with `sgd` (over the reference's parameters).
verify::Lockstep with_sgd(std::shared_ptr<nn::Module> reference, optim::SGD& sgd, double max_norm = 0) {
  return verify::Lockstep(std::move(reference), [&sgd](std::int64_t) {
    sgd.step();
    sgd.zero_grad();
  }, nullptr, max_norm);
}

// How a run can go wrong, from step kFrom on.
enum class Fault { none, gradient, loss, update, start };
constexpr int kFrom = 4;

verify::LockstepSummary run_with(Fault fault, bool reordered) {
  auto model = small_mlp();
  optim::SGD sgd(model->parameters(), 0.1f);
  auto reference = verify::make_reference(small_mlp);
  optim::SGD reference_sgd(reference->parameters(), 0.1f);
  verify::Lockstep check = with_sgd(reference, reference_sgd);
  auto part_loss = [](nn::Module& m, int step, std::size_t part) {
    Tensor l = scale(sum(m(inputs(step, static_cast<int>(part)))), 1.0f / kParts);
    l.backward();
    return l.item();
  };
  if (fault == Fault::start) model->parameters().front().fill_(0.5f);
  for (int step = 0; step < kSteps; ++step) {
    check.begin_step(step, *model);
    float loss = 0;
    for (std::size_t p = 0; p < kParts; ++p) loss += part_loss(*model, step, p);  // accumulation
    if (fault == Fault::gradient && step >= kFrom) model->parameters().front().grad().fill_(1.0f);
    if (fault == Fault::loss && step >= kFrom) loss *= 2;
    if (reordered)
      check.check_reordered(step, model->gradients_to_host(), loss, [&](nn::Module& m, bool reversed) {
        float l = 0;
        for (std::size_t k = 0; k < kParts; ++k) l += part_loss(m, step, reversed ? kParts - 1 - k : k);
        return l;
      });
    else
      check.check_parts(step, *model, loss, kParts, 1.0, [&](nn::Module& m, std::size_t p) { return part_loss(m, step, p); });
    sgd.step();
    if (fault == Fault::update && step >= kFrom) model->parameters().back().fill_(0.25f);
    sgd.zero_grad();
    check.check_update(step);
  }
  return check.finish(*model);
}

TEST(Lockstep, ACorrectRunPassesEveryStepAndEveryUpdate) {
  for (bool reordered : {false, true}) {
    const auto summary = run_with(Fault::none, reordered);
    EXPECT_TRUE(summary.passed) << summary.first_failure;
    EXPECT_EQ(summary.steps, kSteps);
    EXPECT_EQ(summary.updates, kSteps);
    EXPECT_LE(summary.worst_gradient_ratio, 1.0);
  }
}

TEST(Lockstep, EachFaultFailsAtTheStepItBegins) {
  for (bool reordered : {false, true}) {
    for (Fault fault : {Fault::gradient, Fault::loss, Fault::update}) {
      const auto summary = run_with(fault, reordered);
      EXPECT_FALSE(summary.passed);
      EXPECT_EQ(summary.first_failed_step, kFrom) << summary.first_failure;
    }
    const auto started = run_with(Fault::start, reordered);
    EXPECT_FALSE(started.passed);
    EXPECT_EQ(started.first_failed_step, 0);
    EXPECT_NE(started.first_failure.find("starts from"), std::string::npos) << started.first_failure;
  }
  EXPECT_NE(run_with(Fault::update, false).first_failure.find("after the update"), std::string::npos);
  EXPECT_NE(run_with(Fault::gradient, false).first_failure.find("'0.weight'"), std::string::npos);
}

// Clipping: the run's norm must be its gradient's, and the reference repeats the run's factor.
TEST(Lockstep, ANormThatIsNotTheGradientsFails) {
  auto model = small_mlp();
  auto reference = verify::make_reference(small_mlp);
  optim::SGD reference_sgd(reference->parameters(), 0.1f);
  for (double wrong : {1.0, 2.0}) {  // the right norm, then the norm doubled
    verify::Lockstep check = with_sgd(reference, reference_sgd, 1e-3);
    optim::SGD sgd(model->parameters(), 0.1f);
    check.begin_step(0, *model);
    Tensor l = sum((*model)(inputs(0, 0)));
    l.backward();
    check.check_parts(0, *model, l.item(), 1, 1.0, [&](nn::Module& m, std::size_t) {
      Tensor r = sum(m(inputs(0, 0)));
      r.backward();
      return r.item();
    });
    const double norm = optim::clip_grad_norm_(model->parameters(), 1e-3).item();
    sgd.step();
    sgd.zero_grad();
    check.check_update(0, norm * wrong);
    const auto summary = check.finish(*model);
    if (wrong == 1.0) EXPECT_TRUE(summary.passed) << summary.first_failure;
    else EXPECT_NE(summary.first_failure.find("norm"), std::string::npos) << summary.first_failure;
    model = small_mlp();  // the same start for the second round
    reference->load_parameters_from_host(model->parameters_to_host());
  }
}

// An fp16 run whose gradient is not finite where the reference's is: an overflow of the run's own 16-bit
// sums is possible only when its parts, times the loss scale, reach 65504; then run and reference skip
// the step together. With small parts (or no scale) the same infinity is a fault at its step.
TEST(Lockstep, ANonFiniteGradientPassesOnlyWhereItsSixteenBitSumsCouldOverflow) {
  for (double loss_scale : {1.0, 0x1p24}) {  // |parts| ~ 1: scaled by 2^24 they pass 65504
    auto model = small_mlp();
    auto reference = verify::make_reference(small_mlp);
    optim::SGD reference_sgd(reference->parameters(), 0.1f);
    verify::Lockstep check = with_sgd(reference, reference_sgd);
    check.set_rounding(verify::kFloat16Rounding);
    check.set_loss_scale(loss_scale);
    check.begin_step(0, *model);
    std::vector<float> overflowed = model->gradients_to_host();
    overflowed.assign(overflowed.size(), 0.0f);
    overflowed[0] = INFINITY;
    check.check_parts(0, overflowed, 0.0f, kParts, 1.0, [&](nn::Module& m, std::size_t p) {
      Tensor l = scale(sum(m(inputs(0, static_cast<int>(p)))), 1.0f / kParts);
      l.backward();
      return l.item();
    });
    check.check_update(0);
    const auto summary = check.finish(*model);
    EXPECT_EQ(summary.skipped_steps, 1);
    if (loss_scale == 1.0) {
      EXPECT_FALSE(summary.passed);
      EXPECT_NE(summary.first_failure.find("not finite"), std::string::npos) << summary.first_failure;
      EXPECT_NE(summary.first_failure.find("'0.weight'[0]"), std::string::npos) << summary.first_failure;
    } else {
      EXPECT_TRUE(summary.passed) << summary.first_failure;
    }
  }
}

// Part `part` of step `step` of run_against_the_whole_model (below): a small MLP's squared outputs on
// sine inputs, in bf16 when `sixteen_bits`, the inputs scaled by `wrong` from step kFrom on (a bug's
// stand-in, in whichever model computes it). Its gradient is added into `m`; returns its loss.
float bf16_part_loss(nn::Module& m, int step, int part, bool sixteen_bits, float wrong) {
  std::vector<float> x(8 * 16);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.37f * static_cast<float>(i + 29 * step + 11 * part));
  Tensor l;
  {
    Autocast autocast(DType::bfloat16, sixteen_bits);
    const Tensor input = Tensor::from_host(x, {8, 16});
    const Tensor used = step >= kFrom && wrong != 1.0f ? scale(input, wrong) : input;
    l = scale(sum(mul(m(used), m(used))), 1.0f / kParts);
  }
  l.backward();
  return l.item();
}

// A bf16 run of kSteps steps of kParts parts (bf16_part_loss), its inputs scaled by `wrong` from step kFrom
// in the run and in its parts alike when `bug` (as a split layer's bug is in the run and in the split
// reference), checked by parts and against the whole model as it should be; with `split_check`, also the
// parts again in float32 (the split layers' own float32 pass of check_whole).
verify::LockstepSummary run_against_the_whole_model(float wrong, bool bug, bool split_check) {
  auto model = nn::make_mlp(16, 64, 2, 1, nn::Activation::gelu, Device::cpu, 3);
  auto reference = verify::make_reference([] { return nn::make_mlp(16, 64, 2, 1, nn::Activation::gelu, Device::cpu, 3); });
  optim::SGD sgd(model->parameters(), 0.01f), reference_sgd(reference->parameters(), 0.01f);
  verify::Lockstep check = with_sgd(reference, reference_sgd);
  check.set_rounding(verify::kBfloat16Rounding);
  const float scaled = bug ? wrong : 1.0f;
  for (int step = 0; step < kSteps; ++step) {
    check.begin_step(step, *model);
    float loss = 0;
    for (int p = 0; p < kParts; ++p) loss += bf16_part_loss(*model, step, p, true, scaled);
    const auto part = [&](bool sixteen_bits) {
      return [&, sixteen_bits](nn::Module& m, std::size_t p) {
        return bf16_part_loss(m, step, static_cast<int>(p), sixteen_bits, scaled);
      };
    };
    check.check_parts(step, *model, loss, kParts, 1.0, part(true));
    const auto whole = [&](nn::Module& m, bool sixteen_bits) {
      float l = 0;
      for (int p = 0; p < kParts; ++p) l += bf16_part_loss(m, step, p, sixteen_bits, 1.0f);  // as it should be
      return l;
    };
    if (split_check)
      check.check_whole(step, loss, whole, DType::float32, kParts, 1.0, part(false));
    else
      check.check_whole(step, loss, whole, DType::float32);
    sgd.step();
    sgd.zero_grad();
    check.check_update(step);
  }
  return check.finish(*model);
}

// The whole model's check of a 16-bit run (check_whole): a bug that the parts' reference repeats (the
// inputs scaled by 1.25) passes check_parts, and fails check_whole at its step, naming the tensor; the
// correct bf16 run passes both, within a few of its floors.
TEST(Lockstep, TheWholeModelCatchesABugThePartsRepeat) {
  for (const bool bug : {false, true}) {
    const auto summary = run_against_the_whole_model(1.25f, bug, false);
    if (!bug) {
      EXPECT_TRUE(summary.passed) << summary.first_failure;
      EXPECT_GT(summary.worst_whole_ratio, 0.0);
      EXPECT_LE(summary.worst_whole_ratio, 1.0);
      continue;
    }
    EXPECT_FALSE(summary.passed);
    EXPECT_EQ(summary.first_failed_step, kFrom) << summary.first_failure;
    EXPECT_NE(summary.first_failure.find("from the whole model's in float32"), std::string::npos) << summary.first_failure;
    EXPECT_LE(summary.worst_gradient_ratio, 1.0);  // the parts alone would have passed
  }
}

// A bug the split layers share on every rank that is small beside the 16-bit floor (the inputs scaled by
// 1.002, a fifth of a bf16 rounding) passes the whole model's 16-bit comparison; the split layers run
// again in float32 fail at its step, held to a share of that floor. The correct run passes, its split
// layers within their bound.
TEST(Lockstep, TheSplitLayersInFloat32CatchABugBelowTheSixteenBitFloor) {
  for (const bool split_check : {false, true})
    for (const bool bug : {false, true}) {
      const auto summary = run_against_the_whole_model(1.002f, bug, split_check);
      EXPECT_LE(summary.worst_whole_ratio, 1.0) << split_check << bug;  // the 16-bit floor alone cannot see it
      if (!bug || !split_check) {
        EXPECT_TRUE(summary.passed) << summary.first_failure;
        if (split_check) {
          EXPECT_GT(summary.worst_split_ratio, 0.0);
          EXPECT_LE(summary.worst_split_ratio, 1.0);
        } else {
          EXPECT_EQ(summary.worst_split_ratio, 0.0);  // not run
        }
        continue;
      }
      EXPECT_FALSE(summary.passed);
      EXPECT_EQ(summary.first_failed_step, kFrom) << summary.first_failure;
      EXPECT_NE(summary.first_failure.find("the split layers in float32 give the gradient of '"), std::string::npos)
          << summary.first_failure;
    }
}

// A bug of the 16-bit path (here its input scaled by 1.25 where the arithmetic is not emulated, from step
// kFrom), which the parts repeat, fails at its step against the same parts emulated without a 16-bit
// kernel: on the CPU, whose 16-bit kernels compute as the emulation does, because a bit differs; held to
// the floor (a GPU's rule), because it is hundreds of floors away. A correct run passes both ways, on the
// CPU at exactly 0.
TEST(Lockstep, TheEmulatedPartsCatchASixteenBitBugThePartsRepeat) {
  for (const bool to_floor : {false, true})
    for (const bool bug : {false, true}) {
      const auto make = [] { return nn::make_mlp(16, 64, 2, 1, nn::Activation::gelu_tanh, Device::cpu, 3); };
      auto model = make();
      auto reference = verify::make_reference(make);
      optim::SGD sgd(model->parameters(), 0.01f), reference_sgd(reference->parameters(), 0.01f);
      verify::Lockstep check = with_sgd(reference, reference_sgd);
      check.set_rounding(verify::kBfloat16Rounding);
      if (to_floor) check.hold_emulation_to_its_floor();
      auto part_loss = [&](nn::Module& m, int step, int part) {
        Tensor l;
        {
          Autocast autocast(DType::bfloat16);
          const bool emulated = emulated_kept_type() != DType::float32;
          std::vector<float> x(8 * 16);
          for (std::size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.37f * static_cast<float>(i + 29 * step + 11 * part));
          const Tensor batch = Tensor::from_host(x, {8, 16});
          l = scale(sum(m(bug && step >= kFrom && !emulated ? scale(batch, 1.25f) : batch)), 1.0f / kParts);
        }
        l.backward();
        return l.item();
      };
      for (int step = 0; step < kSteps; ++step) {
        check.begin_step(step, *model);
        float loss = 0;
        for (int p = 0; p < kParts; ++p) loss += part_loss(*model, step, p);
        const auto part = [&](nn::Module& m, std::size_t p) { return part_loss(m, step, static_cast<int>(p)); };
        check.check_parts(step, *model, loss, kParts, 1.0, part);
        check.check_emulated(step, kParts, 1.0, part);
        sgd.step();
        sgd.zero_grad();
        check.check_update(step);
      }
      const auto summary = check.finish(*model);
      if (!bug) {
        EXPECT_TRUE(summary.passed) << summary.first_failure;
        EXPECT_EQ(summary.worst_emulated_ratio, 0.0);  // the same bits on the CPU, held to the floor or not
        continue;
      }
      EXPECT_FALSE(summary.passed) << to_floor;
      EXPECT_EQ(summary.first_failed_step, kFrom) << summary.first_failure;
      EXPECT_NE(summary.first_failure.find("the 16-bit kernels' gradient of"), std::string::npos) << summary.first_failure;
      EXPECT_LE(summary.worst_gradient_ratio, 1.0);  // the parts alone would have passed
    }
}

}  // namespace
// The other way round: the reference's parts overflowed where the run's gradient is finite (the run
// lost part of its step): a failure at that step, said so.
TEST(Lockstep, AFiniteRunWhereTheReferenceOverflowedFails) {
  auto model = small_mlp();
  auto reference = verify::make_reference(small_mlp);
  optim::SGD reference_sgd(reference->parameters(), 0.1f);
  verify::Lockstep check = with_sgd(reference, reference_sgd);
  check.set_rounding(verify::kFloat16Rounding);
  check.begin_step(0, *model);
  const std::vector<float> finite(static_cast<std::size_t>(model->parameter_count()), 0.0f);
  check.check_parts(0, finite, 0.0f, kParts, 1.0, [&](nn::Module& m, std::size_t p) {
    Tensor l = scale(sum(m(inputs(0, static_cast<int>(p)))), 1e38f);
    scale(l, 1e38f).backward();  // its gradients overflow
    return 0.0f;
  });
  check.check_update(0);
  const auto summary = check.finish(*model);
  EXPECT_FALSE(summary.passed);
  EXPECT_EQ(summary.first_failed_step, 0);
  EXPECT_NE(summary.first_failure.find("reference's gradient is not finite"), std::string::npos) << summary.first_failure;
}

// The lock-step check's own optimizer (reference_optimizer.h) gives every correct optimizer's bits: SGD with
// and without momentum and weight decay, Adam with L2 decay, AdamW with GPT-2's groups (decay on the matrices
// only), over several steps whose rate changes, from a state taken after some steps had been taken.
TEST(ReferenceOptimizer, GivesEveryOptimizersBitsStepAfterStep) {
  auto model = nn::make_mlp(5, 7, 2, 3, nn::Activation::relu, Device::cpu, 11);
  std::vector<std::unique_ptr<optim::Optimizer>> optimizers;
  optimizers.push_back(std::make_unique<optim::SGD>(model->parameters(), 0.05f));
  optimizers.push_back(std::make_unique<optim::SGD>(model->parameters(), 0.05f, 0.9f, 1e-2f));
  optimizers.push_back(std::make_unique<optim::Adam>(model->parameters(), 1e-2f, 0.9f, 0.999f, 1e-8f, 1e-2f, false));
  optimizers.push_back(std::make_unique<optim::Adam>(optim::weight_decay_groups(model->parameters(), 0.1f), 3e-3f, 0.9f,
                                                     0.95f, 1e-8f, true));
  for (auto& optimizer : optimizers) {
    for (std::uint64_t warm = 0; warm < 2; ++warm) {  // some state first: the reference must take it as it is
      for (const Tensor& p : model->parameters()) Tensor(p).set_grad(Tensor::randn(p.shape(), 40 + warm));
      optimizer->step();
    }
    verify::ReferenceOptimizer formulas(*optimizer, *model);
    for (int step = 0; step < 4; ++step) {
      std::uint64_t seed = 50 + static_cast<std::uint64_t>(10 * step);
      for (const Tensor& p : model->parameters()) Tensor(p).set_grad(Tensor::randn(p.shape(), seed++, Device::cpu, 0.0f, 3.0f));
      optimizer->set_lr(optimizer->lr() * 0.7f);
      std::vector<float> expected = model->parameters_to_host();
      formulas.step(expected, model->gradients_to_host(), optimizer->lr());
      optimizer->step();
      const std::vector<float> got = model->parameters_to_host();
      ASSERT_EQ(got.size(), expected.size());
      for (std::size_t i = 0; i < got.size(); ++i)
        ASSERT_EQ(std::bit_cast<std::uint32_t>(got[i]), std::bit_cast<std::uint32_t>(expected[i]))
            << optimizer->name() << " step " << step << " element " << i;
    }
  }
}

// And it can tell: AdamW whose decay is not scaled by the rate differs from the update the slip begins at.
TEST(ReferenceOptimizer, TellsASlipInTheOptimizerClass) {
  auto model = nn::make_mlp(5, 7, 2, 3, nn::Activation::relu, Device::cpu, 11);
  optim::Adam adamw(optim::weight_decay_groups(model->parameters(), 0.1f), 3e-3f, 0.9f, 0.95f, 1e-8f, true);
  const faults::Armed slip("adamw-decay");  // from step 1 on (faults.h)
  faults::arm("adamw-decay", 1);
  verify::ReferenceOptimizer formulas(adamw, *model);
  for (std::uint64_t step = 0; step < 2; ++step) {
    faults::begin_step(static_cast<std::int64_t>(step));
    for (const Tensor& p : model->parameters()) Tensor(p).set_grad(Tensor::randn(p.shape(), 60 + step));
    std::vector<float> expected = model->parameters_to_host();
    formulas.step(expected, model->gradients_to_host(), adamw.lr());
    adamw.step();
    EXPECT_EQ(model->parameters_to_host() == expected, step == 0) << "step " << step;
  }
}

}  // namespace course::testing
