// The optimizers' family on both devices: SGD and AdamW, AdamW over a list in one launch, clipping's
// tiled sum of squares. The same bits.
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

TEST(KernelParity, LargeShapesAndOptimizers) {
  SKIP_WITHOUT_GPU();
  Tensor a = Tensor::randn({257, 129}, 1), b = Tensor::randn({129, 65}, 2);
  expect_close(matmul(a.to(Device::cuda), b.to(Device::cuda)).to_host(), matmul(a, b).to_host(), "matmul 257x129x65");
  for (int adam = 0; adam < 2; ++adam) {
    Tensor p_cpu = Tensor::randn({1000}, 3), g = Tensor::randn({1000}, 4);
    Tensor p_gpu = p_cpu.to(Device::cuda);
    p_cpu.set_grad(g.clone());
    p_gpu.set_grad(g.to(Device::cuda));
    std::unique_ptr<optim::Optimizer> o_cpu, o_gpu;
    if (adam) {
      o_cpu = std::make_unique<optim::Adam>(std::vector<Tensor>{p_cpu}, 1e-2f, 0.9f, 0.999f, 1e-8f, 0.01f, true);
      o_gpu = std::make_unique<optim::Adam>(std::vector<Tensor>{p_gpu}, 1e-2f, 0.9f, 0.999f, 1e-8f, 0.01f, true);
    } else {
      o_cpu = std::make_unique<optim::SGD>(std::vector<Tensor>{p_cpu}, 1e-2f, 0.9f, 1e-4f);
      o_gpu = std::make_unique<optim::SGD>(std::vector<Tensor>{p_gpu}, 1e-2f, 0.9f, 1e-4f);
    }
    for (int step = 0; step < 3; ++step) {
      o_cpu->step();
      o_gpu->step();
    }
    // The optimizers' formulas are shared and element-wise: the same bits (ZeRO-Offload's host AdamW and a
    // reference's device AdamW must agree exactly).
    expect_same_bits(p_gpu.to_host(), p_cpu.to_host(), adam ? "adamw" : "sgd momentum");
  }
}

// AdamW over a list in one launch (multi-tensor apply, zero_grad folded in): 300 tensors of sizes around
// the chunk's, two launches' worth, against the CPU's walk of the same chunks, bit for bit.
TEST(KernelParity, AdamOverAListIsTheSameBitsOnEveryDevice) {
  SKIP_WITHOUT_GPU();
  std::map<Device, std::vector<Tensor>> state;  // p, g, m, v per tensor
  std::map<Device, std::vector<AdamTensor>> lists;
  for (int t = 0; t < 300; ++t) {
    const std::int64_t n = (t % 5) * 4096 + t % 3 - (t % 5 == 0 ? 0 : 1) + 1;
    std::vector<float> moments = Tensor::randn({2 * n}, 2000 + t).to_host();
    for (std::int64_t i = 0; i < n; ++i) moments[i] *= 0.1f, moments[n + i] *= 0.01f * moments[n + i];  // v >= 0
    const Tensor p = Tensor::randn({n}, 100 + t), g = Tensor::randn({n}, 1000 + t);
    const Tensor m = Tensor::from_host(std::vector<float>(moments.begin(), moments.begin() + n), {n});
    const Tensor v = Tensor::from_host(std::vector<float>(moments.begin() + n, moments.end()), {n});
    for (const Device device : {Device::cpu, Device::cuda}) {
      auto& s = state[device];
      for (const Tensor& x : {p, g, m, v}) s.push_back(x.to(device).clone());
      const std::size_t at = s.size() - 4;
      lists[device].push_back({s[at].data(), s[at + 1].data(), s[at + 2].data(), s[at + 3].data(),
                               static_cast<std::size_t>(n), 0.05f * static_cast<float>(t % 3)});
    }
  }
  const AdamParams a{3e-4f, 0.9f, 0.95f, 1e-8f, true, 0.19f, 0.0975f, /*zero_grad=*/true};
  for (const Device device : {Device::cpu, Device::cuda}) kernels(device).adam_step(lists[device], a);
  const char* parts[] = {" p", " g (zeroed)", " m", " v"};
  for (std::size_t i = 0; i < state[Device::cpu].size(); ++i)
    expect_same_bits(state[Device::cuda][i].to_host(), state[Device::cpu][i].to_host(),
                     std::string("adamw over a list, tensor ") + std::to_string(i / 4) + parts[i % 4]);
}

// Ring attention's block kernels (kernels.h): two blocks of keys folded into one running softmax, the
// finish, and both blocks' gradients, on positions cut as the ring's balanced layout cuts them (a block
// partly above the diagonal, a block wholly below it). The CUDA kernels take each score as a dot
// product where the CPU takes a GEMM's: a few float32 roundings apart, within kParityTolerance.
// Clipping: the sum of squares in the tiled order both devices share (squares_tiled), so the norm, the
// factor and the clipped gradients are the same bits on both.
TEST(KernelParity, ClippingGivesTheSameBitsOnEveryDevice) {
  SKIP_WITHOUT_GPU();
  for (const std::size_t n : {std::size_t{1}, std::size_t{255}, std::size_t{(1 << 20) + 3}}) {
    const Tensor x = Tensor::randn({static_cast<std::int64_t>(n)}, 19);
    Tensor total = Tensor::zeros({2}, Device::cuda);
    kernels(Device::cuda).add_squares(x.to(Device::cuda).data(), n, reinterpret_cast<double*>(total.data()));
    double gpu = 0;
    const auto bits = total.to_host();
    std::memcpy(&gpu, bits.data(), sizeof gpu);
    EXPECT_EQ(std::bit_cast<std::uint64_t>(gpu), std::bit_cast<std::uint64_t>(squares_tiled(x.data(), n, 0.0))) << n;
  }
  std::vector<Tensor> on[2];
  for (int d = 0; d < 2; ++d)
    for (std::uint64_t i = 0; i < 3; ++i) {
      Tensor p = Tensor::zeros({1000 + static_cast<std::int64_t>(i) * 333}, d ? Device::cuda : Device::cpu);
      p.set_grad(Tensor::randn(p.shape(), 20 + i, p.device()));
      on[d].push_back(p);
    }
  const float cpu_norm = optim::clip_grad_norm_(on[0], 1.0).item(), gpu_norm = optim::clip_grad_norm_(on[1], 1.0).item();
  EXPECT_EQ(std::bit_cast<std::uint32_t>(gpu_norm), std::bit_cast<std::uint32_t>(cpu_norm));
  for (std::size_t i = 0; i < 3; ++i)
    expect_same_bits(on[1][i].grad().to_host(), on[0][i].grad().to_host(), "a clipped gradient");
}

}  // namespace
}  // namespace course::testing
