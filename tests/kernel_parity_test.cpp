// Every op on CUDA against the CPU reference, forward and backward, plus determinism of the CUDA
// reductions. These tests skip, saying why, where no GPU is usable; on a GPU machine they run for real.
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

namespace course::testing {
namespace {

// Where the two devices add in different orders: cuBLAS and the CPU's BLAS in their GEMMs, a GPU's tree
// and the CPU's loop in a sum over a whole tensor (a mean's), the attention kernels' own sums (one thread
// per row on the GPU, lanes on the CPU). 1e-5 relative is a few float32 ulps accumulated over
// this table's small shapes.
constexpr double kParityTolerance = 1e-5;

// The ops whose CPU and CUDA kernels share their formula (common/kernels/math.h, in explicitly rounded
// operations) and the order of every sum they make: forward and gradient must be the same bits.
const std::set<std::string> kBitIdenticalOps = {
    "add",  "add_bias_broadcast", "sub_scalar_broadcast", "mul",     "mul_row_broadcast", "scale",
    "relu", "gelu",               "gelu_tanh",            "dropout", "permute",           "narrow",
    "reshape", "layer_norm",      "embedding"};

void expect_same_bits(const std::vector<float>& cuda, const std::vector<float>& cpu, const std::string& what) {
  ASSERT_EQ(cuda.size(), cpu.size()) << what;
  for (std::size_t i = 0; i < cpu.size(); ++i)
    EXPECT_EQ(std::bit_cast<std::uint32_t>(cuda[i]), std::bit_cast<std::uint32_t>(cpu[i]))
        << what << " element " << i << ": " << cuda[i] << " on the GPU, " << cpu[i] << " on the CPU";
}

#define SKIP_WITHOUT_GPU()                                      \
  do {                                                          \
    std::string reason;                                         \
    if (!cuda_usable(&reason)) GTEST_SKIP() << "no usable GPU: " << reason; \
  } while (0)

void expect_close(const std::vector<float>& cuda, const std::vector<float>& cpu, const std::string& what) {
  ASSERT_EQ(cuda.size(), cpu.size()) << what;
  for (std::size_t i = 0; i < cpu.size(); ++i)
    EXPECT_NEAR(cuda[i], cpu[i], kParityTolerance * (1.0 + std::fabs(cpu[i]))) << what << " element " << i;
}

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

TEST(KernelParity, RingAttentionBlocksMatchTheCpu) {
  SKIP_WITHOUT_GPU();
  AttentionBlockShape s;
  s.batch = 2, s.heads = 3, s.head_size = 8, s.queries = 12, s.keys = 12, s.causal = true;
  const std::int64_t c = s.heads * s.head_size;
  const Shape rows{s.batch, s.queries, c}, stats{s.batch, s.heads, s.queries};
  std::vector<float> q_pos, k_pos[2];
  for (std::int64_t i = 0; i < 12; ++i) {
    q_pos.push_back(static_cast<float>(i < 6 ? 6 + i : 30 + i));   // chunks 1 and 6 of 8 (rank 1 of 4)
    k_pos[0].push_back(static_cast<float>(i < 6 ? i : 36 + i));    // rank 0's chunks 0 and 7
    k_pos[1].push_back(static_cast<float>(i < 6 ? 12 + i : 24 + i));  // rank 2's chunks 2 and 5
  }
  std::map<Device, std::vector<std::vector<float>>> results;
  for (const Device device : {Device::cpu, Device::cuda}) {
    Tensor q = Tensor::randn(rows, 1, device), grad_out = Tensor::randn(rows, 9, device);
    Tensor qp = Tensor::from_host(q_pos, {s.queries}, device);
    Tensor m = Tensor::full(stats, -INFINITY, device), l = Tensor::zeros(stats, device), out = Tensor::zeros(rows, device);
    Tensor lse = Tensor::empty(stats, device), dq = Tensor::zeros(rows, device);
    std::vector<Tensor> k, v, kp, dk, dv;
    for (int b = 0; b < 2; ++b) {
      k.push_back(Tensor::randn(rows, 2 + b, device)), v.push_back(Tensor::randn(rows, 4 + b, device));
      kp.push_back(Tensor::from_host(k_pos[b], {s.keys}, device));
      dk.push_back(Tensor::zeros(rows, device)), dv.push_back(Tensor::zeros(rows, device));
      kernels(device).attention_block(q.data(), k[b].data(), v[b].data(), qp.data(), kp[b].data(), s, m.data(), l.data(),
                                      out.data());
    }
    kernels(device).attention_block_finish(m.data(), l.data(), s, out.data(), lse.data());
    for (int b = 0; b < 2; ++b)
      kernels(device).attention_block_backward(q.data(), k[b].data(), v[b].data(), qp.data(), kp[b].data(), out.data(),
                                               lse.data(), grad_out.data(), s, dq.data(), dk[b].data(), dv[b].data());
    results[device] = {out.to_host(), lse.to_host(), dq.to_host(), dk[0].to_host(), dv[0].to_host(), dk[1].to_host(),
                       dv[1].to_host()};
  }
  const char* names[] = {"out", "lse", "dq", "dk of block 0", "dv of block 0", "dk of block 1", "dv of block 1"};
  for (std::size_t i = 0; i < results[Device::cpu].size(); ++i)
    expect_close(results[Device::cuda][i], results[Device::cpu][i], std::string("ring attention ") + names[i]);
}

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

// Attention's probabilities: with whole-number queries and keys and head size 16 (scale 1/4), every score
// is exact whatever order a GEMM adds in, so the softmax rows (kernels/rows.h, lanes on both devices) must
// give the same bits; causal and not, sequences shorter than, at and past a CPU query block (64).
TEST(KernelParity, AttentionProbabilitiesAreTheSameBitsWhereTheScoresAreExact) {
  SKIP_WITHOUT_GPU();
  for (const bool causal : {true, false})
    for (const std::int64_t t : {1, 7, 64, 65, 300}) {
      AttentionShape s;
      s.batch = 2, s.tokens = t, s.heads = 3, s.head_size = 16, s.causal = causal;
      std::vector<float> qkv(static_cast<std::size_t>(s.batch * t * 3 * s.heads * s.head_size));
      for (std::size_t i = 0; i < qkv.size(); ++i) qkv[i] = static_cast<float>(static_cast<int>((i * 2654435761u) >> 7) % 7 - 3);
      const Tensor packed = Tensor::from_host(qkv, {static_cast<std::int64_t>(qkv.size())});
      std::map<Device, std::vector<float>> probs;
      for (const Device device : {Device::cpu, Device::cuda}) {
        const Tensor in = packed.to(device);
        Tensor p = Tensor::zeros({s.batch * s.heads * t * t}, device), y = Tensor::empty({s.batch * t * s.heads * s.head_size}, device);
        kernels(device).attention(in.data(), s, p.data(), y.data());
        probs[device] = p.to_host();
      }
      // Above the diagonal the CPU may leave an entry unwritten (kernels.h): compare what the mask shows.
      for (std::size_t i = 0; i < probs[Device::cpu].size(); ++i) {
        const auto query = static_cast<std::int64_t>(i / static_cast<std::size_t>(t)) % t, key = static_cast<std::int64_t>(i) % t;
        if (causal && key > query) continue;
        ASSERT_EQ(std::bit_cast<std::uint32_t>(probs[Device::cuda][i]), std::bit_cast<std::uint32_t>(probs[Device::cpu][i]))
            << (causal ? "causal" : "full") << " T = " << t << ", probability " << i << ": " << probs[Device::cuda][i]
            << " on the GPU, " << probs[Device::cpu][i] << " on the CPU";
      }
    }
}

// FlashAttention-2's kernels against their CPU model (kernels/flash.h, the same tiles and the same
// explicitly rounded operations): y, each row's log-sum-exp and the whole gradient, bit for bit. Shapes
// that are not multiples of the tiles, T from 1 to 2048, heads 1 to 16, head sizes 16 to 128 and ones
// that do not fill their D, causal and not, with dropout (a sequence slice's index included), and more
// sequence-heads than one grid dimension's 65535; in float32, and in 16 bits read and written in place.
TEST(KernelParity, FlashAttentionIsTheSameBitsOnEveryDevice) {
  SKIP_WITHOUT_GPU();
  struct Case {
    std::int64_t batch, tokens, heads, head_size;
    bool causal;
    float dropout;
    std::int64_t first_sequence;
  };
  for (const Case& c : std::vector<Case>{{1, 1, 1, 16, true, 0, 0},     {2, 7, 3, 8, true, 0, 0},
                                         {1, 33, 16, 24, true, 0, 0},   {2, 64, 2, 64, false, 0, 0},
                                         {3, 65, 2, 32, true, 0.2f, 5}, {1, 130, 2, 128, true, 0, 0},
                                         {1, 300, 4, 40, false, 0.1f, 0}, {1, 2048, 1, 64, true, 0, 0},
                                         {2, 1000, 12, 64, true, 0, 0},
                                         // More sequence-heads than a grid's y may hold (65535).
                                         {4100, 3, 16, 16, true, 0, 0}}) {
    AttentionShape s;
    s.batch = c.batch, s.tokens = c.tokens, s.heads = c.heads, s.head_size = c.head_size, s.causal = c.causal;
    s.dropout = c.dropout, s.seed = 11, s.first_sequence = c.first_sequence;
    const std::int64_t width = s.heads * s.head_size, n = s.batch * s.tokens * width;
    const Tensor qkv = Tensor::randn({3 * n}, 61), dy = Tensor::randn({n}, 62);
    std::map<Device, std::vector<std::vector<float>>> results;
    for (const Device device : {Device::cpu, Device::cuda}) {
      const Tensor in = qkv.to(device), g = dy.to(device);
      Tensor y = Tensor::empty({n}, device), lse = Tensor::empty({s.batch * s.heads * s.tokens}, device),
             grad = Tensor::empty({3 * n}, device);
      kernels(device).flash_attention(in.data(), s, lse.data(), y.data());
      kernels(device).flash_attention_backward(in.data(), y.data(), lse.data(), g.data(), s, grad.data());
      results[device] = {y.to_host(), lse.to_host(), grad.to_host()};
      // The 16-bit kernels, read and written where the tensors lie on the GPU, widened by slices on the CPU.
      for (const DType dtype : {DType::bfloat16, DType::float16}) {
        const Tensor in16 = in.to(dtype), g16 = g.to(dtype);
        Tensor y16 = Tensor::empty({n}, device, dtype), grad16 = Tensor::empty({3 * n}, device, dtype);
        kernels(device).flash_attention_half(half_format(dtype), in16.data16(), s, lse.data(), y16.data16());
        kernels(device).flash_attention_backward_half(half_format(dtype), in16.data16(), y16.data16(), lse.data(),
                                                      g16.data16(), s, grad16.data16());
        for (const Tensor& t : {y16, lse, grad16}) results[device].push_back(t.to(DType::float32).to_host());
      }
    }
    const std::string shape = std::to_string(c.batch) + "x" + std::to_string(c.tokens) + " tokens, " +
                              std::to_string(c.heads) + " heads of " + std::to_string(c.head_size) +
                              (c.causal ? ", causal" : ", full") + (c.dropout > 0 ? ", dropout" : "");
    const char* names[] = {"flash attention's y", "flash attention's lse", "flash attention's gradient"};
    const char* types[] = {"float32", "bfloat16", "float16"};
    for (std::size_t i = 0; i < results[Device::cpu].size(); ++i)
      expect_same_bits(results[Device::cuda][i], results[Device::cpu][i],
                       std::string(types[i / 3]) + " " + names[i % 3] + " " + shape);
  }
}

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
