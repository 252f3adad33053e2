// Mixed precision at the level of the ops: the 16-bit GEMMs accumulate in float32 (within the bound of
// one 16-bit rounding of the exact product of the rounded inputs), autocast casts by its table, and every
// gradient has its tensor's type, float32 for the float32 masters.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <optional>
#include <cstring>
#include <functional>

#include "common/core/memory.h"
#include "common/kernels/kernels.h"
#include "common/nn/gpt.h"
#include "common/ops/autocast.h"
#include "common/ops/ops.h"
#include "common/ops/sdpa_kernel.h"
#include "common/verify/compare.h"

namespace course::testing {
namespace {

verify::Rounding rounding_of(DType dtype) {
  return dtype == DType::bfloat16 ? verify::kBfloat16Rounding : verify::kFloat16Rounding;
}

// C = A B (m x k times k x n) in `dtype`, against the product of the same rounded inputs in double:
// float32 accumulation leaves each element within gamma_32(k) sum |a||b| of exact, and the one rounding
// to 16 bits adds u_16 |C|. A GEMM that accumulated in 16 bits would be off by about k u_16 |C| on these
// positive inputs (k = 2048: hundreds of times the bound).
void expect_float32_accumulation(DType dtype, const Tensor& c16, const std::vector<float>& a, const std::vector<float>& b,
                                 std::int64_t m, std::int64_t k, std::int64_t n, const std::vector<float>& bias = {}) {
  ASSERT_EQ(c16.dtype(), dtype);
  const auto c = c16.to_host();
  const verify::Rounding r = rounding_of(dtype);
  double worst = 0;
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < n; ++j) {
      double exact = bias.empty() ? 0.0 : bias[static_cast<std::size_t>(j)], magnitude = std::fabs(exact);
      for (std::int64_t p = 0; p < k; ++p) {
        const double term = static_cast<double>(a[static_cast<std::size_t>(i * k + p)]) * b[static_cast<std::size_t>(p * n + j)];
        exact += term;
        magnitude += std::fabs(term);
      }
      const double bound = verify::gamma(k + 1) * magnitude + r.unit_roundoff * std::fabs(exact) + r.subnormal;
      const double error = std::fabs(c[static_cast<std::size_t>(i * n + j)] - exact);
      worst = std::max(worst, error / bound);
      ASSERT_LE(error, bound) << dtype_name(dtype) << " element " << i << "," << j << ": " << c[i * n + j] << " vs " << exact;
    }
  std::printf("%s GEMM, k = %lld: worst error %.3f of its bound\n", dtype_name(dtype), static_cast<long long>(k), worst);
}

TEST(MixedPrecision, SixteenBitGemmsAccumulateInFloat32) {
  const std::int64_t m = 8, k = 2048, n = 16;
  for (DType dtype : {DType::bfloat16, DType::float16}) {
    // Positive values, so the sums grow and a 16-bit accumulator would lose digits at every step.
    Tensor a = Tensor::rand_uniform({m, k}, 1, 0.5f, 1.0f).to(dtype), b = Tensor::rand_uniform({k, n}, 2, 0.5f, 1.0f).to(dtype);
    expect_float32_accumulation(dtype, matmul(a, b), a.to_host(), b.to_host(), m, k, n);
    // bmm: two of them, the second at its offset.
    Tensor a2 = Tensor::rand_uniform({2, m, k}, 3, 0.5f, 1.0f).to(dtype), b2 = Tensor::rand_uniform({2, k, n}, 4, 0.5f, 1.0f).to(dtype);
    Tensor c2 = bmm(a2, b2);
    const auto ha = a2.to_host(), hb = b2.to_host();
    expect_float32_accumulation(dtype, c2.flat_view(static_cast<std::size_t>(m * n), static_cast<std::size_t>(m * n)),
                                std::vector<float>(ha.begin() + m * k, ha.end()), std::vector<float>(hb.begin() + k * n, hb.end()),
                                m, k, n);
    // linear: x W^T + b, the bias added before the one rounding. W is [n, k]; its transpose is B.
    Tensor w = Tensor::rand_uniform({n, k}, 5, 0.5f, 1.0f).to(dtype), bias = Tensor::rand_uniform({n}, 6, 1.0f, 2.0f).to(dtype);
    const auto hw = w.to_host();
    std::vector<float> wt(static_cast<std::size_t>(k * n));
    for (std::int64_t p = 0; p < k; ++p)
      for (std::int64_t j = 0; j < n; ++j) wt[static_cast<std::size_t>(p * n + j)] = hw[static_cast<std::size_t>(j * k + p)];
    expect_float32_accumulation(dtype, linear(a, w, bias), a.to_host(), wt, m, k, n, bias.to_host());
  }
}

TEST(MixedPrecision, TheAutocastTableFollowsPytorchs) {
  EXPECT_EQ(autocast_policy("linear"), CastPolicy::lower_precision);
  EXPECT_EQ(autocast_policy("matmul"), CastPolicy::lower_precision);
  EXPECT_EQ(autocast_policy("bmm"), CastPolicy::lower_precision);
  EXPECT_EQ(autocast_policy("attention"), CastPolicy::lower_precision);
  EXPECT_EQ(autocast_policy("layer_norm"), CastPolicy::float32);
  EXPECT_EQ(autocast_policy("softmax"), CastPolicy::float32);
  EXPECT_EQ(autocast_policy("cross_entropy"), CastPolicy::float32);
  EXPECT_EQ(autocast_policy("sum"), CastPolicy::float32);
  EXPECT_EQ(autocast_policy("gelu"), CastPolicy::promote);
  EXPECT_EQ(autocast_policy("add"), CastPolicy::promote);
}

TEST(MixedPrecision, AutocastCastsEachOpsInputsByTheTable) {
  Tensor x = Tensor::randn({4, 8}, 1), w = Tensor::randn({6, 8}, 2, Device::cpu, 0.0f, 0.3f).set_requires_grad(true);
  Tensor b = Tensor::zeros({6}).set_requires_grad(true);
  Tensor gamma = Tensor::ones({6}).set_requires_grad(true), beta = Tensor::zeros({6}).set_requires_grad(true);
  Tensor targets = Tensor::from_host({0, 1, 2, 3}, {4});
  EXPECT_EQ(autocast_dtype(), DType::float32);
  Tensor loss;
  {
    Autocast autocast(DType::bfloat16);
    EXPECT_EQ(autocast_dtype(), DType::bfloat16);
    Tensor h = linear(x, w, b);
    EXPECT_EQ(h.dtype(), DType::bfloat16);                    // lower precision
    EXPECT_EQ(gelu(h).dtype(), DType::bfloat16);              // promote: its input's type
    EXPECT_EQ(add(h, Tensor::zeros({6})).dtype(), DType::float32);  // promote: the wider type
    Tensor n = layer_norm(gelu(h), gamma, beta);
    EXPECT_EQ(n.dtype(), DType::float32);                     // float32, from a bfloat16 input
    EXPECT_EQ(sum(h).dtype(), DType::float32);
    {
      Autocast off(DType::bfloat16, false);
      EXPECT_EQ(linear(x, w, b).dtype(), DType::float32);
    }
    Autocast fp16(DType::float16);  // scopes nest
    EXPECT_EQ(linear(x, w, b).dtype(), DType::float16);
    loss = cross_entropy(linear(n, Tensor::randn({6, 6}, 3), Tensor()), targets);
    EXPECT_EQ(loss.dtype(), DType::float32);
  }
  EXPECT_EQ(autocast_dtype(), DType::float32);
  EXPECT_EQ(linear(x, w, b).dtype(), DType::float32);
  loss.backward();
  // The masters' gradients are float32 (the casts' backward widens them), and they flowed.
  for (Tensor* p : {&w, &b, &gamma, &beta}) {
    ASSERT_TRUE(p->grad().defined());
    EXPECT_EQ(p->grad().dtype(), DType::float32);
    double total = 0;
    for (float g : p->grad().to_host()) total += std::fabs(g);
    EXPECT_GT(total, 0.0);
  }
}

TEST(MixedPrecision, GradientsHaveTheirTensorsType) {
  // A leaf used three times, each use contributing 1 + 2^-8 (float32 arithmetic: the other factor is
  // float32). For a float32 leaf the contributions add to 3 + 3 2^-8 exactly. A bfloat16 leaf's gradient
  // is bfloat16, each contribution rounded to it as it arrives (PyTorch's engine casts likewise): 1 + 2^-8
  // is a tie between 1 and 1 + 2^-7 and rounds to the even 1, so the gradient is 3.
  for (DType dtype : {DType::float32, DType::bfloat16}) {
    Tensor leaf = Tensor::ones({1}, Device::cpu, dtype).set_requires_grad(true);
    Tensor part = Tensor::full({1}, 1.0f + 0x1p-8f);
    Tensor y = add(add(mul(leaf, part), mul(leaf, part)), mul(leaf, part));
    EXPECT_EQ(y.dtype(), DType::float32);
    y.backward();
    ASSERT_EQ(leaf.grad().dtype(), dtype);
    EXPECT_EQ(leaf.grad().item(), dtype == DType::float32 ? 3.0f + 3 * 0x1p-8f : 3.0f);
  }
  // A float32 master cast to bfloat16 for an op gets a float32 gradient: the cast's backward widens it.
  Tensor master = Tensor::full({2}, 0.5f).set_requires_grad(true);
  Tensor copy = cast(master, DType::bfloat16);
  EXPECT_EQ(copy.dtype(), DType::bfloat16);
  sum(mul(copy, Tensor::full({2}, 3.0f))).backward();
  ASSERT_EQ(master.grad().dtype(), DType::float32);
  EXPECT_EQ(master.grad().to_host(), (std::vector<float>{3.0f, 3.0f}));
}

// The GPT's step under autocast against float32 from the same parameters: the loss within a few 16-bit
// roundings, and the gradients pointing the same way (the 16-bit GEMMs round every activation once;
// a bfloat16 step that skipped a cast's backward or a layer's gradient would point elsewhere).
TEST(MixedPrecision, TheGptUnderAutocastFollowsItsFloat32Step) {
  nn::GPTConfig c;
  c.n_layer = 2, c.n_head = 2, c.n_embd = 32, c.block_size = 16, c.vocab_size = 20;
  std::vector<float> ids, targets;
  for (int i = 0; i < 4 * 16; ++i) ids.push_back(static_cast<float>((i * 7) % 20)), targets.push_back(static_cast<float>((i * 3) % 20));
  auto step = [&](DType dtype, std::vector<std::vector<float>>* grads) {
    nn::GPT gpt(c, Device::cpu, 1);
    Tensor loss;
    {
      Autocast autocast(dtype, dtype != DType::float32);
      loss = cross_entropy(reshape(gpt(Tensor::from_host(ids, {4, 16})), {64, 20}), Tensor::from_host(targets, {64}));
    }
    loss.backward();
    for (auto& p : gpt.parameters()) grads->push_back(p.grad().to_host());
    return loss.item();
  };
  std::vector<std::vector<float>> g32, g16;
  const float l32 = step(DType::float32, &g32);
  for (DType dtype : {DType::bfloat16, DType::float16}) {
    g16.clear();
    const float l16 = step(dtype, &g16);
    EXPECT_NEAR(l16, l32, 20 * rounding_of(dtype).unit_roundoff * std::fabs(l32)) << dtype_name(dtype);
    ASSERT_EQ(g16.size(), g32.size());
    for (std::size_t t = 0; t < g32.size(); ++t) {
      double dot = 0, n32 = 0, n16 = 0;
      for (std::size_t i = 0; i < g32[t].size(); ++i)
        dot += g32[t][i] * g16[t][i], n32 += g32[t][i] * g32[t][i], n16 += g16[t][i] * g16[t][i];
      if (n32 == 0) continue;
      EXPECT_GT(dot / std::sqrt(n32 * n16), 0.99) << dtype_name(dtype) << " parameter " << t;
    }
  }
}

// The 16-bit arithmetic emulated (EmulatedSixteenBits: float32 kernels, the roundings as casts) is the
// 16-bit path's computation in another code: on the CPU, whose 16-bit kernels are the float32 formulas on
// the widened values rounded once, the GPT's loss and every gradient come out with the same bits, in both
// formats and with either attention kernel (the math path keeps its probabilities, FlashAttention its
// output, each rounded as the 16-bit path keeps it: without that, the query and key gradients differ).
TEST(MixedPrecision, EmulatedSixteenBitsAreTheSixteenBitPathsBits) {
  nn::GPTConfig c;
  c.n_layer = 2, c.n_head = 2, c.n_embd = 32, c.block_size = 16, c.vocab_size = 20;
  std::vector<float> ids, targets;
  for (int i = 0; i < 4 * 16; ++i) ids.push_back(static_cast<float>((i * 7) % 20)), targets.push_back(static_cast<float>((i * 3) % 20));
  auto step = [&](DType dtype, bool emulated, std::vector<std::vector<float>>* grads) {
    nn::GPT gpt(c, Device::cpu, 1);
    Tensor loss;
    {
      std::optional<EmulatedSixteenBits> emulation;
      if (emulated) emulation.emplace();
      Autocast autocast(dtype);
      loss = cross_entropy(reshape(gpt(Tensor::from_host(ids, {4, 16})), {64, 20}), Tensor::from_host(targets, {64}));
      scale(loss, 1024.0f).backward();  // fp16's loss scale: the gradients' roundings at its range
    }
    for (auto& p : gpt.parameters()) grads->push_back(p.grad().to_host());
    return loss.item();
  };
  for (const SdpBackend backend : {SdpBackend::math, SdpBackend::flash_attention})
  for (DType dtype : {DType::bfloat16, DType::float16}) {
    SdpaKernel attention(backend);
    std::vector<std::vector<float>> native, emulated;
    const float l16 = step(dtype, false, &native), le = step(dtype, true, &emulated);
    EXPECT_EQ(std::bit_cast<std::uint32_t>(l16), std::bit_cast<std::uint32_t>(le)) << dtype_name(dtype) << " " << l16 << " " << le;
    ASSERT_EQ(native.size(), emulated.size());
    for (std::size_t t = 0; t < native.size(); ++t) {
      std::size_t differ = 0;
      for (std::size_t i = 0; i < native[t].size(); ++i) differ += native[t][i] != emulated[t][i];
      EXPECT_EQ(differ, 0u) << dtype_name(dtype) << " parameter " << t << " of " << native[t].size();
    }
  }
}

// In 16 bits the ops widen their operands a slice at a time (attention by sequences, element-wise ops by
// an eighth of the tensor), so that float32 copies do not double the activations' memory. Slicing must
// change nothing: the results equal the kernels run once over the whole tensor in float32 and rounded,
// dropout's mask included (drawn by each probability's index in the whole batch).
TEST(MixedPrecision, SlicedSixteenBitOpsEqualTheWholeTensorsKernels) {
  Kernels& k = kernels(Device::cpu);
  for (DType dtype : {DType::bfloat16, DType::float16}) {
    AttentionShape s;
    s.batch = 16, s.tokens = 8, s.heads = 2, s.head_size = 4, s.dropout = 0.25f, s.seed = 99;  // 16 sequences: 8 slices
    const Tensor qkv = Tensor::rand_uniform({16, 8, 24}, 3, -1.0f, 1.0f).to(dtype).set_requires_grad(true);
    const Tensor g = Tensor::rand_uniform({16, 8, 8}, 4, -1.0f, 1.0f).to(dtype);
    Tensor y = scaled_dot_product_attention(qkv, 2, true, s.dropout, s.seed);
    y.backward(g);
    const Tensor wide = qkv.to(DType::float32);
    Tensor probs = Tensor::empty({16, 2, 8, 8}), y32 = Tensor::empty({16, 8, 8}), grad = Tensor::empty({16, 8, 24});
    k.attention(wide.data(), s, probs.data(), y32.data());
    EXPECT_EQ(y.to_host(), y32.to(dtype).to_host()) << dtype_name(dtype);
    const Tensor kept = probs.to(dtype).to(DType::float32);  // the probabilities as the op keeps them
    k.attention_backward(wide.data(), kept.data(), g.to(DType::float32).data(), s, grad.data());
    EXPECT_EQ(qkv.grad().to_host(), grad.to(dtype).to_host()) << dtype_name(dtype);

    const std::int64_t n = 300001;  // more than 64K elements: five slices, the last one short
    const Tensor x = Tensor::rand_uniform({n}, 5, -3.0f, 3.0f).to(dtype).set_requires_grad(true);
    Tensor out = gelu(x, GeluApproximate::tanh);
    const Tensor gx = Tensor::rand_uniform({n}, 6, -1.0f, 1.0f).to(dtype);
    out.backward(gx);
    Tensor expected = Tensor::empty({n}), expected_grad = Tensor::empty({n});
    k.unary(UnaryOp::gelu_tanh, x.to(DType::float32).data(), expected.data(), static_cast<std::size_t>(n));
    k.unary_backward(UnaryOp::gelu_tanh, x.to(DType::float32).data(), gx.to(DType::float32).data(), expected_grad.data(),
                     static_cast<std::size_t>(n));
    EXPECT_EQ(out.to_host(), expected.to(dtype).to_host()) << dtype_name(dtype);
    EXPECT_EQ(x.grad().to_host(), expected_grad.to(dtype).to_host()) << dtype_name(dtype);
  }
}

// Under autocast a linear layer keeps its float32 weight for backward and rounds it again there, instead
// of keeping the 16-bit copy: the gradients are those of the 16-bit copy, bit for bit.
TEST(MixedPrecision, ALinearLayerRoundsItsWeightAgainInBackward) {
  const Tensor w = Tensor::rand_uniform({24, 40}, 7, -1.0f, 1.0f).set_requires_grad(true);
  const Tensor x = Tensor::rand_uniform({12, 40}, 8, -1.0f, 1.0f).set_requires_grad(true);
  const Tensor g = Tensor::rand_uniform({12, 24}, 9, -1.0f, 1.0f).to(DType::bfloat16);
  Tensor y;
  {
    Autocast autocast(DType::bfloat16);
    y = linear(x, w, Tensor());
  }
  y.backward(g);
  // The same products on copies rounded by hand, with no autocast: dx = g W16, dW = g^T x16.
  const Tensor w16 = w.to(DType::bfloat16).set_requires_grad(true), x16 = x.to(DType::bfloat16).set_requires_grad(true);
  Tensor y16 = linear(x16, w16, Tensor());
  y16.backward(g);
  EXPECT_EQ(y.to_host(), y16.to_host());
  EXPECT_EQ(x.grad().to_host(), x16.grad().to_host());
  EXPECT_EQ(w.grad().to_host(), w16.grad().to_host());
}

// What mixed precision saves: a GPT step's activations at their peak, bf16 against float32 at the same
// batch. Everything backward keeps is 16-bit except the float32 residual stream, which each layer norm
// keeps for its backward (as under PyTorch's autocast): per layer, float32 keeps 64 bytes a token-channel
// (B T C) plus 4 a probability (B H T T), bf16 36 and 2, of which 8 are the residual stream. With
// H T / C = 4 here that is (36 + 8) / (64 + 16) = 0.55 of float32, 0.5 the floor if the residual stream
// were 16-bit too; the peak adds the gradients alive at the start of backward.
constexpr double kMixedActivationRatio = 0.6;
TEST(MixedPrecision, ActivationsInBf16AreLittleMoreThanHalfOfFloat32s) {
  nn::GPTConfig c;
  c.n_layer = 2, c.n_head = 4, c.n_embd = 64, c.block_size = 64, c.vocab_size = 20;
  std::vector<float> ids, targets;
  for (int i = 0; i < 8 * 64; ++i) ids.push_back(static_cast<float>((i * 7) % 20)), targets.push_back(static_cast<float>((i * 3) % 20));
  auto peak = [&](DType dtype) {
    nn::GPT gpt(c, Device::cpu, 1);
    const Tensor input = Tensor::from_host(ids, {8, 64}), target = Tensor::from_host(targets, {512});
    reset_peak_memory(Device::cpu);
    const auto start = memory_stats(Device::cpu).current_of(MemoryCategory::activations);
    {
      Tensor loss;
      {
        Autocast autocast(dtype, dtype != DType::float32);
        loss = cross_entropy(reshape(gpt(input), {512, 20}), target);
      }
      loss.backward();
    }
    return static_cast<double>(memory_stats(Device::cpu).peak_of(MemoryCategory::activations) - start);
  };
  const double fp32 = peak(DType::float32), bf16 = peak(DType::bfloat16);
  std::printf("activations at their peak: float32 %.0f bytes, bf16 %.0f (%.3f)\n", fp32, bf16, bf16 / fp32);
  EXPECT_LE(bf16 / fp32, kMixedActivationRatio);
  EXPECT_GE(bf16 / fp32, 0.5);
}

// The cross-entropy reads 16-bit logits as they are (Kernels::cross_entropy_half, llm.c's fused
// classifier): the same losses and, rounded once, the same gradient as the float32 path on their exact
// widening, bit for bit; under autocast (a float32 loss) and without (a loss of the logits' type). Ignored
// rows, targets at both edges, widths below, at and past the lanes, and GPT-2's vocabulary.
TEST(MixedPrecision, CrossEntropyOnSixteenBitLogitsIsTheFloat32PathsBits) {
  for (const DType dtype : {DType::bfloat16, DType::float16})
    for (const bool autocast : {true, false})
      for (const auto& [rows, cols] : std::vector<std::pair<std::int64_t, std::int64_t>>{{1, 1}, {5, 7}, {37, 1000}, {9, 50304}}) {
        SCOPED_TRACE(std::string(dtype_name(dtype)) + (autocast ? " under autocast, " : ", ") + std::to_string(rows) +
                     " x " + std::to_string(cols));
        const Tensor logits = mul(Tensor::randn({rows, cols}, 71), Tensor::full({rows, cols}, 8.0f)).to(dtype).set_requires_grad(true);
        const Tensor widened = logits.detach().to(DType::float32).set_requires_grad(true);
        std::vector<float> t(static_cast<std::size_t>(rows));
        for (std::int64_t r = 0; r < rows; ++r)
          t[static_cast<std::size_t>(r)] = r % 4 == 3 ? -100.0f : static_cast<float>(r % 2 ? cols - 1 : (r * 13) % cols);
        const Tensor targets = Tensor::from_host(t, {rows});
        Tensor loss;
        {
          Autocast scope(dtype, autocast);
          loss = cross_entropy_per_row(logits, targets);
        }
        ASSERT_EQ(loss.dtype(), autocast ? DType::float32 : dtype);
        const Tensor g = Tensor::randn({rows}, 72).to(loss.dtype());  // the losses' incoming gradient
        loss.backward(g);
        const Tensor reference = cross_entropy_per_row(widened, targets);
        reference.backward(g.to(DType::float32));
        // Bit for bit, but for the sign of zero: a leaf's gradient is added into zeros, where -0 becomes +0,
        // and the reference's float32 gradient is cast to 16 bits after that, so a value that rounds to
        // -0 in 16 bits is +0 on one side and -0 on the other.
        const auto same = [](const Tensor& a, const Tensor& b) {
          auto x = a.to(DType::float32).to_host(), y = b.to(DType::float32).to_host();
          for (float& v : x) v += 0.0f;
          for (float& v : y) v += 0.0f;
          return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
        };
        EXPECT_TRUE(same(loss, reference.to(loss.dtype()))) << "the losses differ";
        ASSERT_EQ(logits.grad().dtype(), dtype);
        EXPECT_TRUE(same(logits.grad(), widened.grad().to(dtype))) << "the gradients differ";
      }
}

// And it keeps no float32 copy: at GPT-2's vocabulary under autocast, what the loss holds for backward
// beside the 16-bit logits is a few values a row, where the same loss on the logits cast to float32 first
// holds a float32 copy of them (4 bytes an element; its backward then makes a float32 gradient too).
TEST(MixedPrecision, CrossEntropyOnSixteenBitLogitsKeepsNoFloat32Copy) {
  const std::int64_t rows = 16, cols = 50304, elements = rows * cols;
  std::vector<float> t(static_cast<std::size_t>(rows), 5.0f);
  const Tensor targets = Tensor::from_host(t, {rows});
  const Tensor logits = Tensor::randn({rows, cols}, 73).to(DType::bfloat16).set_requires_grad(true);
  const auto held = [&](bool widened_first) {
    const auto start = memory_stats(Device::cpu).current_total;
    Autocast scope(DType::bfloat16);
    const Tensor loss = cross_entropy(widened_first ? cast(logits, DType::float32) : logits, targets);
    return memory_stats(Device::cpu).current_total - start;
  };
  const auto direct = held(false), widened = held(true);
  std::printf("cross-entropy over %lld bf16 logits, bytes held for backward: %lld read as they are, %lld widened "
              "first\n", static_cast<long long>(elements), static_cast<long long>(direct), static_cast<long long>(widened));
  EXPECT_LE(direct, 64 * rows + 4096);
  EXPECT_GE(widened, 4 * elements);
}

// The 16-bit element-wise ops read and write their 16-bit tensors (Kernels::unary_half, binary_half): a
// bf16 GELU, its gradient (with the leaf's) and a bf16 residual add allocate their 16-bit outputs and
// nothing else (16-bit zeros filled in 16 bits, Kernels::fill_bits), where
// widening through float32 slices would add an eighth of the tensor in floats twice over; a float32
// leaf adds a 16-bit gradient without a float32 copy of it (add_half).
TEST(MixedPrecision, SixteenBitElementWiseOpsAllocateOnlyTheirOutputs) {
  const std::int64_t n = 1 << 20;
  for (const DType dtype : {DType::bfloat16, DType::float16}) {
    const Tensor x = Tensor::randn({n}, 81).to(dtype).set_requires_grad(true), r = Tensor::randn({n}, 82).to(dtype);
    const Tensor g = Tensor::randn({n}, 83).to(dtype);
    const auto grown = [](const std::function<void()>& f) {
      reset_peak_memory(Device::cpu);
      const auto start = memory_stats(Device::cpu).current_total;
      f();
      return memory_stats(Device::cpu).peak_total - start;
    };
    const std::int64_t bytes = 2 * n;
    Tensor y;
    EXPECT_EQ(grown([&] { y = gelu(x, GeluApproximate::tanh); }), bytes) << dtype_name(dtype) << " gelu";
    EXPECT_EQ(grown([&] { y.backward(g); }), 2 * bytes) << dtype_name(dtype) << " gelu's gradient and x's";
    EXPECT_EQ(grown([&] { y = add(y.detach(), r); }), bytes) << dtype_name(dtype) << " add";
    Tensor acc = Tensor::zeros({n});
    EXPECT_EQ(grown([&] { acc.add_(g); }), 0) << dtype_name(dtype) << " a 16-bit gradient into a float32 one";
    EXPECT_EQ(acc.to_host(), g.to(DType::float32).to_host()) << dtype_name(dtype);
  }
}

}  // namespace
}  // namespace course::testing
