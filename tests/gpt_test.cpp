// The GPT: GPT-2's parameter names and count with the head tied to the token table, attention against
// a naive double-precision reference written with loops, causality, the tied weight's gradient, the
// initialisation, and bad sizes refused in one line.
#include "common/nn/gpt.h"

#include <gtest/gtest.h>

#include <cmath>

#include "common/core/memory.h"
#include "common/ops/autocast.h"
#include "common/ops/ops.h"
#include "common/optim/optimizer.h"

namespace course::testing {
namespace {

nn::GPTConfig small() {
  nn::GPTConfig c;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 16;
  c.block_size = 8;
  c.vocab_size = 11;
  return c;
}

Tensor ids_of(const std::vector<float>& ids, std::int64_t batch) {
  return Tensor::from_host(ids, {batch, static_cast<std::int64_t>(ids.size()) / batch});
}

TEST(Gpt, ParametersHaveGpt2NamesAndTheHeadIsTied) {
  nn::GPT gpt(small(), Device::cpu, 1);
  auto named = gpt.named_parameters();
  std::vector<std::string> names;
  for (const auto& [name, p] : named) names.push_back(name);
  const std::vector<std::string> first = {"transformer.wte.weight",
                                          "transformer.wpe.weight",
                                          "transformer.h.0.ln_1.weight",
                                          "transformer.h.0.ln_1.bias",
                                          "transformer.h.0.attn.c_attn.weight",
                                          "transformer.h.0.attn.c_attn.bias",
                                          "transformer.h.0.attn.c_proj.weight",
                                          "transformer.h.0.attn.c_proj.bias",
                                          "transformer.h.0.ln_2.weight",
                                          "transformer.h.0.ln_2.bias",
                                          "transformer.h.0.mlp.c_fc.weight",
                                          "transformer.h.0.mlp.c_fc.bias",
                                          "transformer.h.0.mlp.c_proj.weight",
                                          "transformer.h.0.mlp.c_proj.bias"};
  ASSERT_GE(names.size(), first.size());
  EXPECT_EQ(std::vector<std::string>(names.begin(), names.begin() + static_cast<std::ptrdiff_t>(first.size())), first);
  EXPECT_EQ(names.back(), "transformer.ln_f.bias");  // no lm_head: the head is wte
  const std::int64_t c = 16, v = 11, t = 8;
  const std::int64_t per_layer =
      2 * c + (3 * c * c + 3 * c) + (c * c + c) + 2 * c + (4 * c * c + 4 * c) + (4 * c * c + c);
  EXPECT_EQ(gpt.parameter_count(), v * c + t * c + 2 * per_layer + 2 * c);
}

TEST(Gpt, InitialisationIsGpt2s) {
  nn::GPTConfig c = small();
  c.n_embd = 64;
  c.vocab_size = 512;
  nn::GPT gpt(c, Device::cpu, 3);
  auto stddev = [](const Tensor& t) {
    double s = 0, s2 = 0;
    auto v = t.to_host();
    for (float x : v) s += x, s2 += static_cast<double>(x) * x;
    const double n = static_cast<double>(v.size()), mean = s / n;
    return std::sqrt(s2 / n - mean * mean);
  };
  for (const auto& [name, p] : gpt.named_parameters()) {
    if (name.find("c_proj.weight") != std::string::npos) {
      EXPECT_NEAR(stddev(p), 0.02 / std::sqrt(4.0), 0.002) << name;  // 1/sqrt(2 n_layer)
    } else if (name.find(".weight") != std::string::npos && name.find("ln_") == std::string::npos) {
      EXPECT_NEAR(stddev(p), 0.02, 0.002) << name;
    } else if (name.find("ln_") != std::string::npos && name.find(".weight") != std::string::npos) {
      EXPECT_EQ(p.to_host(), std::vector<float>(static_cast<std::size_t>(p.numel()), 1.0f)) << name;
    } else {
      EXPECT_EQ(p.to_host(), std::vector<float>(static_cast<std::size_t>(p.numel()), 0.0f)) << name;
    }
  }
}

// Attention written out with loops in double: per head, softmax over keys 0..i of q_i . k_j / sqrt(hs).
std::vector<double> naive_attention(const std::vector<float>& x, std::int64_t batch, std::int64_t t, std::int64_t c,
                                    std::int64_t heads, const nn::CausalSelfAttention& attn) {
  const auto wa = attn.c_attn->weight.to_host(), ba = attn.c_attn->bias.to_host();
  const auto wp = attn.c_proj->weight.to_host(), bp = attn.c_proj->bias.to_host();
  const std::int64_t hs = c / heads;
  std::vector<double> out(static_cast<std::size_t>(batch * t * c));
  for (std::int64_t b = 0; b < batch; ++b) {
    std::vector<std::vector<double>> qkv(static_cast<std::size_t>(t),
                                         std::vector<double>(static_cast<std::size_t>(3 * c)));
    for (std::int64_t i = 0; i < t; ++i)
      for (std::int64_t o = 0; o < 3 * c; ++o) {
        double s = ba[static_cast<std::size_t>(o)];
        for (std::int64_t k = 0; k < c; ++k)
          s += static_cast<double>(wa[static_cast<std::size_t>(o * c + k)]) *
               x[static_cast<std::size_t>((b * t + i) * c + k)];
        qkv[static_cast<std::size_t>(i)][static_cast<std::size_t>(o)] = s;
      }
    std::vector<std::vector<double>> y(static_cast<std::size_t>(t),
                                       std::vector<double>(static_cast<std::size_t>(c), 0.0));
    for (std::int64_t h = 0; h < heads; ++h)
      for (std::int64_t i = 0; i < t; ++i) {
        std::vector<double> score(static_cast<std::size_t>(i + 1));
        double top = -1e300, z = 0;
        for (std::int64_t j = 0; j <= i; ++j) {
          double s = 0;
          for (std::int64_t d = 0; d < hs; ++d)
            s += qkv[static_cast<std::size_t>(i)][static_cast<std::size_t>(h * hs + d)] *
                 qkv[static_cast<std::size_t>(j)][static_cast<std::size_t>(c + h * hs + d)];
          score[static_cast<std::size_t>(j)] = s / std::sqrt(static_cast<double>(hs));
          top = std::max(top, score[static_cast<std::size_t>(j)]);
        }
        for (auto& s : score) z += (s = std::exp(s - top));
        for (std::int64_t j = 0; j <= i; ++j)
          for (std::int64_t d = 0; d < hs; ++d)
            y[static_cast<std::size_t>(i)][static_cast<std::size_t>(h * hs + d)] +=
                score[static_cast<std::size_t>(j)] / z *
                qkv[static_cast<std::size_t>(j)][static_cast<std::size_t>(2 * c + h * hs + d)];
      }
    for (std::int64_t i = 0; i < t; ++i)
      for (std::int64_t o = 0; o < c; ++o) {
        double s = bp[static_cast<std::size_t>(o)];
        for (std::int64_t k = 0; k < c; ++k)
          s += static_cast<double>(wp[static_cast<std::size_t>(o * c + k)]) *
               y[static_cast<std::size_t>(i)][static_cast<std::size_t>(k)];
        out[static_cast<std::size_t>((b * t + i) * c + o)] = s;
      }
  }
  return out;
}

TEST(Gpt, AttentionMatchesANaiveReference) {
  nn::GPTConfig c = small();
  c.n_embd = 12;
  c.n_head = 3;
  nn::CausalSelfAttention attn(c, Device::cpu, 5);
  const std::int64_t batch = 2, t = 5;
  Tensor x = Tensor::randn({batch, t, 12}, 8);
  const auto got = attn(x).to_host();
  const auto expected = naive_attention(x.to_host(), batch, t, 12, 3, attn);
  ASSERT_EQ(got.size(), expected.size());
  // float32 through a few chained sums of 12 terms: 1e-5 relative is ample, and a wrong mask, scale or
  // head split is off by far more.
  for (std::size_t i = 0; i < got.size(); ++i)
    EXPECT_NEAR(got[i], expected[i], 1e-5 * (1 + std::fabs(expected[i]))) << i;
}

TEST(Gpt, LaterTokensDoNotChangeEarlierLogits) {
  nn::GPT gpt(small(), Device::cpu, 2);
  auto a = gpt(ids_of({1, 2, 3, 4, 5, 6}, 1)).to_host();
  auto b = gpt(ids_of({1, 2, 3, 9, 9, 9}, 1)).to_host();
  const std::size_t v = 11;
  EXPECT_EQ(std::vector<float>(a.begin(), a.begin() + 3 * v), std::vector<float>(b.begin(), b.begin() + 3 * v));
  EXPECT_NE(std::vector<float>(a.begin() + 3 * v, a.end()), std::vector<float>(b.begin() + 3 * v, b.end()));
}

TEST(Gpt, TheTiedWeightGetsTheHeadsGradientToo) {
  nn::GPT gpt(small(), Device::cpu, 4);
  // Token 10 never appears in the input, so its embedding row's gradient can only come from the head.
  Tensor logits = gpt(ids_of({1, 2, 3, 4, 1, 2, 3, 4}, 2));
  cross_entropy(logits, Tensor::from_host({2, 3, 4, 5, 2, 3, 4, 5}, {8})).backward();
  auto grad = gpt.wte.grad().to_host();
  double row10 = 0;
  for (std::size_t d = 0; d < 16; ++d) row10 += std::fabs(grad[10 * 16 + d]);
  EXPECT_GT(row10, 0.0);
  int with_grad = 0;
  for (const auto& p : gpt.parameters()) with_grad += p.grad().defined();
  EXPECT_EQ(with_grad, static_cast<int>(gpt.parameters().size()));  // every parameter, the tied one once
}

TEST(Gpt, LearnsToRepeatASequence) {
  // Overfitting one batch: the loss must fall from about ln(11) = 2.4 to near zero.
  nn::GPT gpt(small(), Device::cpu, 6);
  optim::Adam adam(gpt.parameters(), 1e-2f);
  Tensor ids = ids_of({1, 5, 2, 7, 3, 9, 4, 8}, 1), targets = Tensor::from_host({5, 2, 7, 3, 9, 4, 8, 1}, {8});
  float first = 0, last = 0;
  for (int step = 0; step < 60; ++step) {
    Tensor loss = cross_entropy(gpt(ids), targets);
    if (step == 0) first = loss.item();
    last = loss.item();
    loss.backward();
    adam.step();
    adam.zero_grad();
  }
  EXPECT_NEAR(first, std::log(11.0), 0.3);
  EXPECT_LT(last, 0.05);
}

// Activation recomputation changes what backward keeps, not what it computes: the loss and every
// gradient bit-identical with none, selective and full, in float32 and under bf16 autocast, with dropout
// on (the block run again draws the forward's masks); and the activations at their peak fall from none
// to selective (attention's probabilities) to full (each block's input only).
TEST(Gpt, RecomputationGivesTheSameGradientsInLessMemory) {
  nn::GPTConfig c = small();
  c.n_layer = 4, c.block_size = 32, c.dropout = 0.1f;
  std::vector<float> ids, targets;
  for (int i = 0; i < 8 * 32; ++i) ids.push_back(static_cast<float>((i * 7) % 11)), targets.push_back(static_cast<float>((i * 5) % 11));
  for (DType dtype : {DType::float32, DType::bfloat16}) {
    std::vector<std::vector<float>> first;
    float first_loss = 0;
    std::int64_t previous_peak = 0;
    for (nn::Recompute recompute : {nn::Recompute::none, nn::Recompute::selective, nn::Recompute::full}) {
      nn::GPT gpt(c, Device::cpu, 3);
      gpt.set_recompute(recompute);
      const Tensor input = ids_of(ids, 8), target = Tensor::from_host(targets, {256});
      reset_peak_memory(Device::cpu);
      const std::int64_t before = memory_stats(Device::cpu).current_of(MemoryCategory::activations);
      float loss_value = 0;
      {
        Tensor loss;
        {
          Autocast autocast(dtype, dtype != DType::float32);
          loss = cross_entropy(gpt(input), target);
        }
        loss.backward();
        loss_value = loss.item();
      }
      const std::int64_t peak = memory_stats(Device::cpu).peak_of(MemoryCategory::activations) - before;
      std::vector<std::vector<float>> grads;
      for (const Tensor& p : gpt.parameters()) grads.push_back(p.grad().to_host());
      const int r = static_cast<int>(recompute);
      if (recompute == nn::Recompute::none) {
        first = grads, first_loss = loss_value;
      } else {
        EXPECT_EQ(loss_value, first_loss) << dtype_name(dtype) << " recompute " << r;
        ASSERT_EQ(grads.size(), first.size());
        for (std::size_t i = 0; i < grads.size(); ++i) EXPECT_EQ(grads[i], first[i]) << dtype_name(dtype) << " recompute " << r << " parameter " << i;
        EXPECT_LT(peak, previous_peak) << dtype_name(dtype) << " recompute " << r;
      }
      std::printf("%s, recompute %d: activations at their peak %lld bytes\n", dtype_name(dtype), r, static_cast<long long>(peak));
      previous_peak = peak;
    }
  }
}

TEST(Gpt, BadSizesAreRefused) {
  nn::GPTConfig c = small();
  c.n_head = 3;  // does not divide 16
  EXPECT_THROW(nn::GPT(c, Device::cpu, 1), UsageError);
  for (auto field : {&nn::GPTConfig::n_layer, &nn::GPTConfig::n_embd, &nn::GPTConfig::block_size,
                     &nn::GPTConfig::vocab_size, &nn::GPTConfig::n_head}) {
    nn::GPTConfig z = small();
    z.*field = 0;
    EXPECT_THROW(z.check(), UsageError);
  }
  nn::GPT gpt(small(), Device::cpu, 1);
  EXPECT_THROW(gpt(ids_of(std::vector<float>(9, 1.0f), 1)), std::invalid_argument);  // longer than block_size
}

}  // namespace
}  // namespace course::testing
