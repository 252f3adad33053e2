// The planner's formulas against the figures their papers publish: ZeRO's model states of a 7.5B-
// parameter model on 64 GPUs (figure 1), GPT-3's parameter count and its training time on 1,024 A100s
// and the 1-trillion-parameter model's on 3,072 (Megatron-LM 2021, section 5.1), every model size of its
// table 1, the FLOPs formula's link to 8 B s P, and Korthikanti et al.'s activation memory: each form
// against the others.
#include <gtest/gtest.h>

#include <cmath>

#include "common/planner/formulas.h"
#include "common/planner/published.h"

namespace course::planner {
namespace {

constexpr double kGB = 1e9;  // the papers' gigabytes
const GptShape kGpt3{96, 12288, 96, 2048, 51200};

// Rajbhandari et al. 2020, figure 1: Psi = 7.5B, N = 64, K = 12 (mixed precision with Adam): the
// baseline 120 GB per GPU, P_os 31.4 GB, P_os+g 16.6 GB, P_os+g+p 1.9 GB. The paper rounds to the
// tenth of a GB (three significant figures): the formulas are within that rounding.
TEST(Planner, ZerosModelStatesAreItsFigureOne) {
  const double psi = 7.5e9;
  const double published[] = {120.0, 31.4, 16.6, 1.9};
  for (int stage = 0; stage <= 3; ++stage) {
    const double gb = zero_model_states(stage, psi, 64, DType::bfloat16).total() / kGB;
    EXPECT_NEAR(gb, published[stage], 0.05) << "stage " << stage;
  }
  // Each term as the paper writes it: (2 + 2 + K) Psi, 2 Psi + 2 Psi + K Psi / N, ...
  EXPECT_DOUBLE_EQ(zero_model_states(0, psi, 64, DType::float16).total(), 16 * psi);
  EXPECT_DOUBLE_EQ(zero_model_states(1, psi, 64, DType::float16).total(), 4 * psi + 12 * psi / 64);
  EXPECT_DOUBLE_EQ(zero_model_states(2, psi, 64, DType::float16).total(), 2 * psi + 14 * psi / 64);
  EXPECT_DOUBLE_EQ(zero_model_states(3, psi, 64, DType::float16).total(), 16 * psi / 64);
  // ZeRO-Offload at stage 2: only the 16-bit parameters stay on the GPU.
  const ModelStates offloaded = zero_model_states(2, psi, 64, DType::float16, parallel::ZeroOptions::Offload::optimizer);
  EXPECT_DOUBLE_EQ(offloaded.total(), 2 * psi);
  EXPECT_DOUBLE_EQ(offloaded.host, 14 * psi / 64);
}

// GPT-3: 96 layers of 12288, sequences of 2048, Megatron's vocabulary of 51,200: "175B".
TEST(Planner, Gpt3HasItsParameters) {
  const double p = parameters(kGpt3);
  EXPECT_NEAR(p / 1e9, 175.0, 1.0) << p;
  // The dominant term: 12 l h^2.
  EXPECT_NEAR(p / (12.0 * 96 * 12288.0 * 12288.0), 1.0, 0.005);
}

// Every row of the Megatron-LM paper's table 1: the parameter formula gives the size the paper prints
// (to its rounding, 0.05B), and the row's own figures agree with each other (the share of the A100's
// 312 TFLOP/s, the aggregate over its GPUs), so the table was taken down as printed.
TEST(Planner, TheParameterFormulaGivesEverySizeOfMegatronsTable) {
  ASSERT_EQ(megatron_2021_table1().size(), 10u);
  for (const PublishedRun& r : megatron_2021_table1()) {
    EXPECT_NEAR(parameters(r.shape) / 1e9, r.billions, 0.05 + 1e-9) << r.billions;
    EXPECT_NEAR(100 * r.tflops_per_gpu * 1e12 / kA100PeakFlops, r.percent_of_peak, 0.5) << r.billions;
    EXPECT_NEAR(r.tflops_per_gpu * r.gpus / 1000, r.aggregate_pflops, 0.006 * r.aggregate_pflops) << r.billions;
    EXPECT_EQ(r.gpus % (r.tp * r.pp), 0) << r.billions;
    EXPECT_EQ(r.shape.hidden % r.shape.heads, 0) << r.billions;
  }
}

// Section 5.1 of the Megatron-LM paper: GPT-3 on 300B tokens with 1,024 A100s at 140 TFLOP/s per GPU
// takes about 34 days; the 1T-parameter model on 450B tokens with 3,072 A100s at 163 TFLOP/s, about 84.
TEST(Planner, TrainingTimesAreThePapersEstimates) {
  const double day = 86400;
  EXPECT_NEAR(training_seconds(300e9, 175e9, 1024, 140e12, true) / day, 34.0, 0.5);
  EXPECT_NEAR(training_seconds(450e9, 1e12, 3072, 163e12, true) / day, 84.0, 1.0);
}

// 96 B s l h^2 (1 + s/6h + V/16lh) is 8 B s P but for the attention scores' s/6h, which the paper's
// estimate drops (2.8% for GPT-3) and the small terms of P (within half a percent). Without
// recomputation the iteration is a forward fewer: 3/4 of the layers' FLOPs, and the logit layer's the same.
TEST(Planner, AnIterationsFlopsAreEightTokensTimesParameters) {
  const double batch = 1536, s = 2048;
  const double with = flops_per_iteration(kGpt3, batch, true), without = flops_per_iteration(kGpt3, batch, false);
  EXPECT_NEAR(with / (8 * batch * s * parameters(kGpt3)), 1.0 + s / (6 * 12288.0), 0.005);
  const double logits = 6 * batch * s * 12288.0 * 51200;  // 2 B s h V forward, twice that backward
  EXPECT_NEAR((without - logits) / (with - logits), 0.75, 1e-12);
}

// Korthikanti et al. 2022, table 2, per layer: the forms agree where they meet (t = 1: sequence
// parallelism changes nothing; 34 + 5as/h is 10 + 24 + 5as/h), selective recomputation removes exactly
// the 5 a s^2 b attention term, and tensor with sequence parallelism divides everything by t.
TEST(Planner, ActivationsPerLayerAreKorthikantisTable) {
  const double b = 1, s = 2048, h = 12288, a = 96;
  const double sbh = s * b * h;
  EXPECT_DOUBLE_EQ(activation_bytes_per_layer(kGpt3, b, 1, false, Recompute::none), sbh * (34 + 5 * a * s / h));
  EXPECT_DOUBLE_EQ(activation_bytes_per_layer(kGpt3, b, 1, false, Recompute::none),
                   activation_bytes_per_layer(kGpt3, b, 1, true, Recompute::none));
  for (const int t : {1, 2, 8}) {
    const double none = activation_bytes_per_layer(kGpt3, b, t, false, Recompute::none);
    const double selective = activation_bytes_per_layer(kGpt3, b, t, false, Recompute::selective);
    EXPECT_DOUBLE_EQ(none - selective, 5 * a * s * s * b / t) << t;
    EXPECT_DOUBLE_EQ(activation_bytes_per_layer(kGpt3, b, t, true, Recompute::none),
                     activation_bytes_per_layer(kGpt3, b, 1, false, Recompute::none) / t) << t;
    EXPECT_DOUBLE_EQ(activation_bytes_per_layer(kGpt3, b, t, true, Recompute::selective), 34 * sbh / t) << t;
    EXPECT_DOUBLE_EQ(activation_bytes_per_layer(kGpt3, b, t, false, Recompute::full), 2 * sbh) << t;
  }
}

}  // namespace
}  // namespace course::planner
