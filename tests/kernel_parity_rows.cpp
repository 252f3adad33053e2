// The row and column families on both devices: two-stage column sums, rows in lanes (layer norm and the
// cross-entropy), the fused 16-bit cross-entropy. The same bits.
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

// Column sums in two stages (math::column_chunks): a linear layer's bias gradient (sum_rows) and layer
// norm's weight and bias gradients, at no rows, within one chunk, at its edges, at GPT-2's 8192 x 768
// and past the grid's 65535 chunks of rows: the same bits on both devices.
TEST(KernelParity, ColumnSumsGiveTheSameBitsOnEveryDevice) {
  SKIP_WITHOUT_GPU();
  for (const auto& [rows, cols] : std::vector<std::pair<std::int64_t, std::int64_t>>{
           {0, 5}, {1, 1}, {255, 7}, {256, 768}, {257, 33}, {8195, 768}, {65536 * 256 + 300, 2}}) {
    const std::string shape = std::to_string(rows) + " x " + std::to_string(cols);
    const Tensor x = Tensor::randn({std::max<std::int64_t>(rows, 1), cols}, 21), g = Tensor::randn(x.shape(), 22);
    std::map<Device, std::vector<std::vector<float>>> results;
    for (const Device device : {Device::cpu, Device::cuda}) {
      const Tensor xd = x.to(device), gd = g.to(device);
      Tensor sums = Tensor::empty({cols}, device), mean = Tensor::empty({std::max<std::int64_t>(rows, 1)}, device),
             rstd = Tensor::empty(mean.shape(), device), out = Tensor::empty(x.shape(), device),
             dx = Tensor::empty(x.shape(), device), dw = Tensor::empty({cols}, device), db = Tensor::empty({cols}, device);
      const Tensor w = Tensor::randn({cols}, 23).to(device), b = Tensor::randn({cols}, 24).to(device);
      Kernels& k = kernels(device);
      const auto r = static_cast<std::size_t>(rows), c = static_cast<std::size_t>(cols);
      k.sum_rows(xd.data(), r, c, sums.data());
      k.layer_norm(xd.data(), w.data(), b.data(), r, c, 1e-5f, out.data(), mean.data(), rstd.data());
      k.layer_norm_backward(xd.data(), w.data(), mean.data(), rstd.data(), gd.data(), r, c, dx.data(), dw.data(), db.data());
      results[device] = {sums.to_host(), dw.to_host(), db.to_host()};
    }
    expect_same_bits(results[Device::cuda][0], results[Device::cpu][0], "sum_rows " + shape);
    expect_same_bits(results[Device::cuda][1], results[Device::cpu][1], "layer norm's weight gradient " + shape);
    expect_same_bits(results[Device::cuda][2], results[Device::cpu][2], "layer norm's bias gradient " + shape);
  }
}

// Rows in lanes (common/kernels/rows.h): layer norm forward and its input gradient, the cross-entropy and
// its gradient, a group of kLanes threads to a row on the GPU; at widths below, at and past the lanes,
// GPT-2's, a vocabulary's, and more rows than one grid holds (65535 blocks of 32 rows). Ignored targets
// and targets at both edges. The same bits on both devices.
TEST(KernelParity, RowKernelsGiveTheSameBitsOnEveryDevice) {
  SKIP_WITHOUT_GPU();
  for (const auto& [rows, cols] : std::vector<std::pair<std::size_t, std::size_t>>{
           {1, 1}, {3, 7}, {5, 8}, {33, 9}, {4101, 768}, {1027, 50304}, {2100003, 2}}) {
    const std::string shape = std::to_string(rows) + " x " + std::to_string(cols);
    const auto n = static_cast<std::int64_t>(rows * cols);
    const Tensor x = mul(Tensor::randn({n}, 51), Tensor::full({n}, 8.0f)), g = Tensor::randn({n}, 52);
    const Tensor w = Tensor::randn({static_cast<std::int64_t>(cols)}, 53), b = Tensor::randn(w.shape(), 54);
    std::vector<float> targets(rows), row_grads(rows);
    for (std::size_t r = 0; r < rows; ++r) {
      targets[r] = r % 4 == 3 ? -100.0f : static_cast<float>(r % 2 ? cols - 1 : (r * 13) % cols);
      row_grads[r] = 0.25f + static_cast<float>(r % 3);
    }
    const auto r64 = static_cast<std::int64_t>(rows);
    const Tensor t = Tensor::from_host(targets, {r64}), rg = Tensor::from_host(row_grads, {r64});
    std::map<Device, std::vector<std::vector<float>>> results;
    for (const Device device : {Device::cpu, Device::cuda}) {
      const Tensor xd = x.to(device), gd = g.to(device), wd = w.to(device), bd = b.to(device), td = t.to(device),
                   rgd = rg.to(device);
      Tensor out = Tensor::empty(x.shape(), device), mean = Tensor::empty({r64}, device), rstd = Tensor::empty({r64}, device),
             dx = Tensor::empty(x.shape(), device), dw = Tensor::empty(w.shape(), device), db = Tensor::empty(w.shape(), device),
             losses = Tensor::empty({r64}, device), dlogits = Tensor::empty(x.shape(), device);
      Kernels& k = kernels(device);
      k.layer_norm(xd.data(), wd.data(), bd.data(), rows, cols, 1e-5f, out.data(), mean.data(), rstd.data());
      k.layer_norm_backward(xd.data(), wd.data(), mean.data(), rstd.data(), gd.data(), rows, cols, dx.data(), dw.data(),
                            db.data());
      k.cross_entropy(xd.data(), td.data(), rows, cols, losses.data());
      k.cross_entropy_backward(xd.data(), td.data(), rgd.data(), rows, cols, dlogits.data());
      results[device] = {out.to_host(), mean.to_host(), rstd.to_host(), dx.to_host(), losses.to_host(), dlogits.to_host()};
    }
    const char* names[] = {"layer norm", "layer norm's means", "layer norm's 1/std", "layer norm's input gradient",
                           "cross-entropy", "cross-entropy's gradient"};
    for (std::size_t i = 0; i < results[Device::cpu].size(); ++i)
      expect_same_bits(results[Device::cuda][i], results[Device::cpu][i], std::string(names[i]) + " " + shape);
  }
}

// The cross-entropy on 16-bit logits (Kernels::cross_entropy_half, the fused classifier): the losses, each
// row's top and total, and the 16-bit gradient, bf16 and fp16, at the row kernels' shapes.
TEST(KernelParity, SixteenBitCrossEntropyGivesTheSameBitsOnEveryDevice) {
  SKIP_WITHOUT_GPU();
  for (const HalfFormat format : {HalfFormat::bfloat16, HalfFormat::float16})
    for (const auto& [rows, cols] : std::vector<std::pair<std::size_t, std::size_t>>{
             {1, 1}, {3, 7}, {33, 9}, {1027, 50304}, {2100003, 2}}) {
      const std::string shape = std::string(format == HalfFormat::bfloat16 ? "bf16 " : "fp16 ") + std::to_string(rows) +
                                " x " + std::to_string(cols);
      const auto n = static_cast<std::int64_t>(rows * cols), r64 = static_cast<std::int64_t>(rows);
      const DType dtype = format == HalfFormat::bfloat16 ? DType::bfloat16 : DType::float16;
      const Tensor x = mul(Tensor::randn({n}, 55), Tensor::full({n}, 8.0f)).to(dtype);
      std::vector<float> targets(rows), row_grads(rows);
      for (std::size_t r = 0; r < rows; ++r) {
        targets[r] = r % 4 == 3 ? -100.0f : static_cast<float>(r % 2 ? cols - 1 : (r * 13) % cols);
        row_grads[r] = 0.25f + static_cast<float>(r % 3);
      }
      const Tensor t = Tensor::from_host(targets, {r64}), rg = Tensor::from_host(row_grads, {r64});
      std::map<Device, std::vector<std::vector<float>>> results;
      for (const Device device : {Device::cpu, Device::cuda}) {
        const Tensor xd = x.to(device), td = t.to(device), rgd = rg.to(device);
        Tensor losses = Tensor::empty({r64}, device), top = Tensor::empty({r64}, device),
               total = Tensor::empty({2 * r64}, device), grad = Tensor::empty({n}, device, dtype);
        Kernels& k = kernels(device);
        k.cross_entropy_half(format, xd.data16(), td.data(), rows, cols, losses.data(), top.data(),
                             reinterpret_cast<double*>(total.data()));
        k.cross_entropy_backward_half(format, xd.data16(), td.data(), rgd.data(), top.data(),
                                      reinterpret_cast<const double*>(total.data()), rows, cols, grad.data16());
        results[device] = {losses.to_host(), top.to_host(), total.to_host(), grad.to(DType::float32).to_host()};
      }
      const char* names[] = {"cross-entropy", "its rows' top", "its rows' totals", "its 16-bit gradient"};
      for (std::size_t i = 0; i < results[Device::cpu].size(); ++i)
        expect_same_bits(results[Device::cuda][i], results[Device::cpu][i], std::string(names[i]) + " " + shape);
    }
}

}  // namespace
}  // namespace course::testing
