// The attention family on both devices: ring attention's block kernels, the probabilities' rows where
// the scores are exact, FlashAttention-2 against its CPU model.
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

}  // namespace
}  // namespace course::testing
