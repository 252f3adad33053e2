// The element-wise family on both devices: the shared formulas over a million values of every magnitude,
// and the 16-bit kernels over every bit pattern. The same bits.
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

// Element-wise work on a million values of every magnitude (the normal's tails, exponents from 2^-30 to
// 2^30): AdamW and SGD, GELU both ways and their gradients, the 16-bit casts, the grad scaler's unscale
// and its inf check, dropout, layer norm over long rows. The same bits on both devices.
TEST(KernelParity, SharedFormulasGiveTheSameBitsOnEveryDevice) {
  SKIP_WITHOUT_GPU();
  const std::int64_t n = 1 << 20;
  Tensor x = mul(Tensor::randn({n}, 11), Tensor::from_host([&] {
    std::vector<float> scales(static_cast<std::size_t>(n));
    for (std::size_t i = 0; i < scales.size(); ++i) scales[i] = std::ldexp(1.0f, static_cast<int>(i % 61) - 30);
    return scales;
  }(), {n}));
  const Tensor g = Tensor::randn({n}, 12);
  for (const auto& [name, f] : std::vector<std::pair<std::string, std::function<Tensor(const Tensor&)>>>{
           {"gelu", [](const Tensor& t) { return gelu(t); }},
           {"gelu_tanh", [](const Tensor& t) { return gelu(t, GeluApproximate::tanh); }},
           {"dropout", [](const Tensor& t) { return dropout(t, 0.1f, 77); }},
           {"bfloat16", [](const Tensor& t) { return t.to(DType::bfloat16).to(DType::float32); }},
           {"float16", [](const Tensor& t) { return t.to(DType::float16).to(DType::float32); }},
           {"layer_norm", [](const Tensor& t) {
              return layer_norm(reshape(t, {1024, 1024}), Tensor::randn({1024}, 13, t.device()),
                                Tensor::randn({1024}, 14, t.device()));
            }}}) {
    Tensor on_cpu = x.clone().set_requires_grad(true), on_gpu = x.to(Device::cuda).set_requires_grad(true);
    Tensor out_cpu = f(on_cpu), out_gpu = f(on_gpu);
    expect_same_bits(out_gpu.to_host(), out_cpu.to_host(), name);
    if (name == "bfloat16" || name == "float16") continue;
    sum(mul(reshape(out_cpu, {n}), g)).backward();
    sum(mul(reshape(out_gpu, {n}), g.to(Device::cuda))).backward();
    expect_same_bits(on_gpu.grad().to_host(), on_cpu.grad().to_host(), name + "'s gradient");
  }
  for (const bool decoupled : {true, false}) {
    Tensor p_cpu = x.clone(), p_gpu = x.to(Device::cuda);
    p_cpu.set_grad(g.clone());
    p_gpu.set_grad(g.to(Device::cuda));
    optim::Adam cpu({p_cpu}, 3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, decoupled), gpu({p_gpu}, 3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, decoupled);
    for (int step = 0; step < 3; ++step) cpu.step(), gpu.step();
    expect_same_bits(p_gpu.to_host(), p_cpu.to_host(), decoupled ? "adamw" : "adam");
  }
  for (const float scale : {1024.0f, 1e38f}) {  // the second overflows: the check must find it on both
    optim::GradScalerOptions options;
    options.enabled = true, options.init_scale = scale;
    optim::GradScaler cpu(options), gpu(options);
    Tensor g_cpu = mul(g, Tensor::full({n}, scale)), g_gpu = g_cpu.to(Device::cuda);
    cpu.unscale_(std::vector<Tensor>{g_cpu});
    gpu.unscale_(std::vector<Tensor>{g_gpu});
    EXPECT_EQ(gpu.found_inf(), cpu.found_inf()) << scale;
    expect_same_bits(g_gpu.to_host(), g_cpu.to_host(), "the grad scaler's unscale");
  }
}

// The 16-bit element-wise kernels read and write 16 bits on both devices (Kernels::binary_half, ...):
// every bit pattern through each activation and its gradient, random pairs through each binary op with
// each way of repeating an operand, a 16-bit fill, and a 16-bit gradient added into a float32 one.
TEST(KernelParity, SixteenBitElementWiseKernelsGiveTheSameBitsOnEveryDevice) {
  SKIP_WITHOUT_GPU();
  const std::int64_t n = 1 << 16;
  std::vector<float> patterns(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < patterns.size(); ++i) patterns[i] = static_cast<float>(i);
  const Tensor every = Tensor::from_host(patterns, {n}), shuffled = Tensor::rand_uniform({n}, 31, 0.0f, 65536.0f);
  const Tensor acc0 = Tensor::randn({n}, 32);
  for (const DType dtype : {DType::bfloat16, DType::float16}) {
    const HalfFormat format = half_format(dtype);
    std::map<Device, std::vector<std::vector<float>>> results;
    for (const Device device : {Device::cpu, Device::cuda}) {
      // The patterns as 16-bit tensors: each float below 2^16 written as the bits it counts.
      const auto bits = [&](const Tensor& counts) {
        std::vector<std::uint16_t> host(static_cast<std::size_t>(n));
        const auto values = counts.to_host();
        for (std::size_t i = 0; i < host.size(); ++i) host[i] = static_cast<std::uint16_t>(values[i]);
        Tensor t = Tensor::empty({n}, Device::cpu, dtype);
        std::memcpy(t.data16(), host.data(), host.size() * sizeof(std::uint16_t));
        return t.to(device);
      };
      const Tensor x = bits(every), g = bits(shuffled);
      Kernels& k = kernels(device);
      std::vector<std::vector<float>>& out = results[device];
      const auto keep = [&](const Tensor& t) { out.push_back(t.to(DType::float32).to_host()); };
      for (const UnaryOp op : {UnaryOp::relu, UnaryOp::gelu, UnaryOp::gelu_tanh}) {
        Tensor y = Tensor::empty({n}, device, dtype), dx = Tensor::empty({n}, device, dtype);
        k.unary_half(format, op, x.data16(), y.data16(), static_cast<std::size_t>(n));
        k.unary_backward_half(format, op, x.data16(), g.data16(), dx.data16(), static_cast<std::size_t>(n));
        keep(y), keep(dx);
      }
      for (const auto& [an, bn] : std::vector<std::pair<std::size_t, std::size_t>>{{65536, 65536}, {65536, 768}, {768, 65536}, {65536, 1}, {65536, 3}})
        for (const BinaryOp op : {BinaryOp::add, BinaryOp::sub, BinaryOp::mul, BinaryOp::max}) {
          Tensor y = Tensor::empty({n}, device, dtype);
          k.binary_half(format, op, x.data16(), an, g.data16() + (65536 - bn), bn, y.data16(), static_cast<std::size_t>(n));
          keep(y);
        }
      keep(Tensor::full({n}, 0.1f, device, dtype));  // fill_bits, the value rounded on the host
      Tensor acc = acc0.clone().to(device);  // its own storage: on the CPU, to() would return acc0 itself
      k.add_half(format, g.data16(), acc.data(), static_cast<std::size_t>(n));
      keep(acc);
    }
    for (std::size_t i = 0; i < results[Device::cpu].size(); ++i)
      expect_same_bits(results[Device::cuda][i], results[Device::cpu][i],
                       std::string(dtype_name(dtype)) + " element-wise result " + std::to_string(i));
  }
}

}  // namespace
}  // namespace course::testing
