// Every op of the op table on CUDA against the CPU reference, forward and backward (in float32 and
// under autocast), the reductions' determinism, the scatter-adds and the random generators. The other
// families' parity cases live beside this file: kernel_parity_{elementwise,optim,rows,attention}.cpp.
// These tests skip, saying why, where no GPU is usable; on a GPU machine they run for real.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <set>

#include "common/kernels/kernels.h"
#include "common/ops/autocast.h"
#include "common/optim/grad_scaler.h"
#include "common/optim/optimizer.h"
#include "support/op_cases.h"
#include "support/parity.h"

namespace course::testing {
namespace {

// The ops whose CPU and CUDA kernels share their formula (common/kernels/math.h, in explicitly rounded
// operations) and the order of every sum they make: forward and gradient must be the same bits.
const std::set<std::string> kBitIdenticalOps = {
    "add",  "add_bias_broadcast", "sub_scalar_broadcast", "mul",     "mul_row_broadcast", "scale",
    "relu", "gelu",               "gelu_tanh",            "dropout", "permute",           "narrow",
    "reshape", "layer_norm",      "embedding"};

class KernelParityTest : public ::testing::TestWithParam<OpCase> {};

TEST_P(KernelParityTest, CudaMatchesCpu) {
  SKIP_WITHOUT_GPU();
  const OpCase& c = GetParam();
  std::vector<Tensor> cpu_in, cuda_in;
  for (std::size_t i = 0; i < c.inputs.size(); ++i) {
    Tensor t = Tensor::rand_uniform(c.inputs[i], 7 + i, static_cast<float>(c.input_low), static_cast<float>(c.input_high));
    cpu_in.push_back(t.clone().set_requires_grad(true));
    cuda_in.push_back(t.to(Device::cuda).set_requires_grad(true));
  }
  Tensor cpu_out = c.op(cpu_in), cuda_out = c.op(cuda_in);
  EXPECT_EQ(cuda_out.device(), Device::cuda);
  const auto compare = kBitIdenticalOps.count(c.name) ? expect_same_bits : expect_close;
  compare(cuda_out.to_host(), cpu_out.to_host(), c.name + " forward");
  Tensor w = Tensor::rand_uniform(cpu_out.shape(), 5, -1.0f, 1.0f);
  sum(mul(cpu_out, w)).backward();
  sum(mul(cuda_out, w.to(Device::cuda))).backward();
  for (std::size_t i = 0; i < cpu_in.size(); ++i)
    compare(cuda_in[i].grad().to_host(), cpu_in[i].grad().to_host(), c.name + " grad " + std::to_string(i));
}

// Every op again under autocast, in bfloat16 and in float16: its GEMMs on the 16-bit path (cublasGemmEx
// with float32 accumulation against the CPU's widened float32 GEMM), the rest reading 16-bit operands.
// Each device computes its float32 result within kParityTolerance of the other's and rounds it once to
// 16 bits, so the two may land one 16-bit step apart (2u relative); a gradient is computed from saved
// 16-bit activations that may themselves differ by that step, so it gets twice as much: 4u.
TEST_P(KernelParityTest, CudaMatchesCpuUnderAutocast) {
  SKIP_WITHOUT_GPU();
  const OpCase& c = GetParam();
  for (DType dtype : {DType::bfloat16, DType::float16}) {
    const double u = dtype == DType::bfloat16 ? 0x1p-8 : 0x1p-11;
    auto close = [&](const std::vector<float>& cuda, const std::vector<float>& cpu, const std::string& what) {
      ASSERT_EQ(cuda.size(), cpu.size()) << what;
      for (std::size_t i = 0; i < cpu.size(); ++i)
        EXPECT_NEAR(cuda[i], cpu[i], 4 * u * (1.0 + std::fabs(cpu[i]))) << what << " element " << i;
    };
    std::vector<Tensor> cpu_in, cuda_in;
    for (std::size_t i = 0; i < c.inputs.size(); ++i) {
      Tensor t = Tensor::rand_uniform(c.inputs[i], 7 + i, static_cast<float>(c.input_low), static_cast<float>(c.input_high));
      cpu_in.push_back(t.clone().set_requires_grad(true));
      cuda_in.push_back(t.to(Device::cuda).set_requires_grad(true));
    }
    Tensor cpu_out, cuda_out;
    {
      Autocast autocast(dtype);
      cpu_out = c.op(cpu_in);
      cuda_out = c.op(cuda_in);
    }
    EXPECT_EQ(cuda_out.dtype(), cpu_out.dtype());
    close(cuda_out.to_host(), cpu_out.to_host(), c.name + " forward in " + dtype_name(dtype));
    Tensor w = Tensor::rand_uniform(cpu_out.shape(), 5, -1.0f, 1.0f);
    sum(mul(cpu_out, w)).backward();
    sum(mul(cuda_out, w.to(Device::cuda))).backward();
    for (std::size_t i = 0; i < cpu_in.size(); ++i)
      close(cuda_in[i].grad().to_host(), cpu_in[i].grad().to_host(), c.name + " grad " + std::to_string(i) + " in " + dtype_name(dtype));
  }
}

INSTANTIATE_TEST_SUITE_P(AllOps, KernelParityTest, ::testing::ValuesIn(op_cases()),
                         [](const auto& info) { return info.param.name; });

TEST(KernelParity, CudaReductionsAreBitwiseDeterministic) {
  SKIP_WITHOUT_GPU();
  Tensor x = Tensor::randn({1 << 20}, 9, Device::cuda);
  Tensor rows = Tensor::randn({4096, 33}, 10, Device::cuda);
  float first = sum(x).item();
  auto first_rows = Tensor::empty({33}, Device::cuda);
  kernels(Device::cuda).sum_rows(rows.data(), 4096, 33, first_rows.data());
  auto expected_rows = first_rows.to_host();
  for (int run = 0; run < 20; ++run) {
    EXPECT_EQ(sum(x).item(), first);
    kernels(Device::cuda).sum_rows(rows.data(), 4096, 33, first_rows.data());
    EXPECT_EQ(first_rows.to_host(), expected_rows);
  }
}

TEST(KernelParity, ScatterAddsAndBroadcastGradientsAreBitIdenticalToTheCpu) {
  // The embedding's scatter-add and the broadcast gradient's sum_to add in the same order on both
  // devices (increasing index; float for the first, double for the second), so the bits agree, run
  // after run: no atomics anywhere.
  SKIP_WITHOUT_GPU();
  std::vector<float> ids(5000);
  for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<float>((i * 7919) % 13);  // heavy repeats
  auto embedding_grad = [&](Device device) {
    Tensor w = Tensor::randn({13, 64}, 3, device).set_requires_grad(true);
    Tensor out = embedding(Tensor::from_host(ids, {5000}, device), w);
    sum(mul(out, Tensor::randn({5000, 64}, 4, device))).backward();
    return w.grad().to_host();
  };
  auto broadcast_grad = [&](Device device) {
    Tensor a = Tensor::randn({8, 1, 6, 1}, 5, device).set_requires_grad(true);
    Tensor b = Tensor::randn({7, 1, 5}, 6, device).set_requires_grad(true);
    sum(mul(mul(a, b), Tensor::randn({8, 7, 6, 5}, 7, device))).backward();
    auto ga = a.grad().to_host(), gb = b.grad().to_host();
    ga.insert(ga.end(), gb.begin(), gb.end());
    return ga;
  };
  const auto cpu_embedding = embedding_grad(Device::cpu), cpu_broadcast = broadcast_grad(Device::cpu);
  for (int run = 0; run < 5; ++run) {
    EXPECT_EQ(embedding_grad(Device::cuda), cpu_embedding);
    EXPECT_EQ(broadcast_grad(Device::cuda), cpu_broadcast);
  }
}

TEST(KernelParity, RandomValuesAreIdenticalOnBothDevices) {
  SKIP_WITHOUT_GPU();
  EXPECT_EQ(Tensor::randn({1000}, 5, Device::cuda).to_host(), Tensor::randn({1000}, 5).to_host());
  EXPECT_EQ(Tensor::rand_uniform({1000}, 5, -1, 1, Device::cuda).to_host(), Tensor::rand_uniform({1000}, 5, -1, 1).to_host());
}

}  // namespace
}  // namespace course::testing
