// Model FLOPs utilisation's two halves (common/metrics/mfu.h): nanoGPT's FLOP count, worked by hand here,
// and the peak a GPU's product name selects (the variants that share a word with another must not match it).
#include <gtest/gtest.h>

#include "common/metrics/mfu.h"

namespace course::testing {
namespace {

TEST(Mfu, CountsFlopsAsNanoGptsEstimateMfu) {
  // 6 N + 12 L H Q T, N without the position embeddings: 6 (1000 - 100) + 12 x 2 x 4 x 16 x 8.
  EXPECT_DOUBLE_EQ(metrics::gpt_flops_per_token({1000, 100, 2, 4, 64, 8}), 5400.0 + 12288.0);
  // GPT-2 124M at a context of 1024 (vocabulary 50,304, as nanoGPT pads it): 124,475,904 parameters,
  // 786,432 of them position embeddings; attention's term is 12 x 12 x 12 x 64 x 1024 = 113,246,208.
  EXPECT_DOUBLE_EQ(metrics::gpt_flops_per_token({124475904, 786432, 12, 12, 768, 1024}),
                   6.0 * 123689472.0 + 113246208.0);
}

TEST(Mfu, PeaksComeFromTheGpusNameAndTheGemmsType) {
  EXPECT_DOUBLE_EQ(metrics::peak_tflops("NVIDIA H100 80GB HBM3", DType::bfloat16, false), 989.4);
  EXPECT_DOUBLE_EQ(metrics::peak_tflops("NVIDIA H100 80GB HBM3", DType::float32, false), 66.9);
  EXPECT_DOUBLE_EQ(metrics::peak_tflops("NVIDIA H100 80GB HBM3", DType::float32, true), 494.7);
  EXPECT_DOUBLE_EQ(metrics::peak_tflops("NVIDIA H100 PCIe", DType::float16, false), 756.0);  // not the SXM's
  EXPECT_DOUBLE_EQ(metrics::peak_tflops("NVIDIA H200", DType::bfloat16, false), 989.4);
  EXPECT_DOUBLE_EQ(metrics::peak_tflops("NVIDIA A100-SXM4-80GB", DType::float32, false), 19.5);
  EXPECT_EQ(metrics::peak_tflops("Some Future GPU", DType::bfloat16, false), 0.0);  // unknown: --peak-tflops
}

}  // namespace
}  // namespace course::testing
