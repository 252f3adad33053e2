// The op table shared by the gradient and parity tests: each case builds inputs, runs the library op,
// and has an independent double-precision reference written with plain loops.
#pragma once
#include <algorithm>
#include <cctype>
#include <cmath>
#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "common/ops/ops.h"
#include "common/tensor/random.h"

namespace course::testing {

using Values = std::vector<double>;

struct OpCase {
  std::string name;
  std::vector<Shape> inputs;                                      // shapes of the differentiable inputs
  std::function<Tensor(const std::vector<Tensor>&)> op;           // the library op
  std::function<Values(const std::vector<Values>&)> reference;    // same op in double
  double input_low = -2.0, input_high = 2.0;                      // range of random inputs
};

// GoogleTest prints a case by its name instead of its bytes.
inline void PrintTo(const OpCase& c, std::ostream* out) { *out << c.name; }

inline Values broadcast_binary(const Values& a, const Values& b, const std::function<double(double, double)>& f) {
  std::size_t n = std::max(a.size(), b.size());
  Values out(n);
  for (std::size_t i = 0; i < n; ++i) out[i] = f(a[i % a.size()], b[i % b.size()]);
  return out;
}

// NumPy's broadcasting written out independently of the library: the result shape, and each output
// element's operands found by walking its multi-index, right-aligned.
inline Shape numpy_shape(const Shape& a, const Shape& b) {
  std::size_t rank = std::max(a.size(), b.size());
  Shape out(rank);
  for (std::size_t d = 0; d < rank; ++d) {
    std::int64_t x = d + a.size() >= rank ? a[d + a.size() - rank] : 1;
    std::int64_t y = d + b.size() >= rank ? b[d + b.size() - rank] : 1;
    out[d] = x == 1 ? y : x;
  }
  return out;
}
inline std::size_t numpy_offset(const Shape& operand, const Shape& out, const std::vector<std::int64_t>& index) {
  std::size_t offset = 0;
  const std::size_t pad = out.size() - operand.size();
  for (std::size_t d = 0; d < operand.size(); ++d)
    offset = offset * static_cast<std::size_t>(operand[d]) +
             static_cast<std::size_t>(operand[d] == 1 ? 0 : index[d + pad]);
  return offset;
}
inline Values numpy_binary(const Values& a, const Shape& sa, const Values& b, const Shape& sb,
                           const std::function<double(double, double)>& f) {
  const Shape out = numpy_shape(sa, sb);
  Values result(static_cast<std::size_t>(shape_numel(out)));
  std::vector<std::int64_t> index(out.size(), 0);
  for (std::size_t i = 0; i < result.size(); ++i) {
    std::size_t rest = i;
    for (std::size_t d = out.size(); d-- > 0;) {
      index[d] = static_cast<std::int64_t>(rest % static_cast<std::size_t>(out[d]));
      rest /= static_cast<std::size_t>(out[d]);
    }
    result[i] = f(a[numpy_offset(sa, out, index)], b[numpy_offset(sb, out, index)]);
  }
  return result;
}

// The cases of NumPy's broadcasting documentation (numpy.org, "Broadcasting"), and the ones a
// suffix-only rule got wrong.
struct BroadcastCase {
  Shape a, b, result;
};
inline std::vector<BroadcastCase> numpy_broadcast_cases() {
  return {{{5, 4}, {1}, {5, 4}},          {{5, 4}, {4}, {5, 4}},
          {{15, 3, 5}, {15, 1, 5}, {15, 3, 5}}, {{15, 3, 5}, {3, 5}, {15, 3, 5}},
          {{15, 3, 5}, {3, 1}, {15, 3, 5}}, {{8, 1, 6, 1}, {7, 1, 5}, {8, 7, 6, 5}},
          {{16, 16, 3}, {3}, {16, 16, 3}},  {{4, 1}, {3}, {4, 3}},
          {{1, 1, 5}, {4, 5}, {1, 4, 5}},   {{3, 1}, {1, 4}, {3, 4}},
          {{1}, {2, 3}, {2, 3}},            {{2, 1, 3}, {2, 4, 1}, {2, 4, 3}}};
}
// Shapes that must be refused (NumPy: "operands could not be broadcast together").
inline std::vector<std::pair<Shape, Shape>> numpy_incompatible_cases() {
  return {{{3}, {4}}, {{2, 1}, {8, 4, 3}}, {{5, 4}, {5}}, {{2, 3}, {3, 2}}};
}

// C = op(A) op(B), row-major, straight from the definition.
inline Values reference_matmul(const Values& a, const Values& b, std::int64_t m, std::int64_t k, std::int64_t n,
                               bool ta, bool tb) {
  Values c(static_cast<std::size_t>(m * n), 0.0);
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < n; ++j)
      for (std::int64_t p = 0; p < k; ++p) {
        double x = ta ? a[static_cast<std::size_t>(p * m + i)] : a[static_cast<std::size_t>(i * k + p)];
        double y = tb ? b[static_cast<std::size_t>(j * k + p)] : b[static_cast<std::size_t>(p * n + j)];
        c[static_cast<std::size_t>(i * n + j)] += x * y;
      }
  return c;
}

inline double reference_gelu(double x) { return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0))); }

inline double reference_gelu_tanh(double x) {
  return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}

inline double total(const Values& v) {
  double s = 0.0;
  for (double x : v) s += x;
  return s;
}

// Self-attention from its definition, in double: for each sequence b, head h and query i, the scores
// q_i . k_j / sqrt(hs) over the keys j it may see (j <= i when causal), their softmax (times the dropout
// mask, drawn as the dropout op draws it), and the weighted sum of the v_j. qkv is [B, T, 3C] with q, k,
// v side by side and the heads next to each other inside each; y is [B, T, C].
inline Values reference_attention(const Values& qkv, std::int64_t batch, std::int64_t t, std::int64_t heads,
                                  std::int64_t hs, bool causal, float p = 0.0f, std::uint64_t seed = 0) {
  const std::int64_t c = heads * hs;
  auto at = [&](std::int64_t b, std::int64_t pos, int part, std::int64_t h, std::int64_t d) {
    return qkv[static_cast<std::size_t>((b * t + pos) * 3 * c + part * c + h * hs + d)];
  };
  Values y(static_cast<std::size_t>(batch * t * c), 0.0);
  for (std::int64_t b = 0; b < batch; ++b)
    for (std::int64_t h = 0; h < heads; ++h)
      for (std::int64_t i = 0; i < t; ++i) {
        const std::int64_t keys = causal ? i + 1 : t;
        Values weight(static_cast<std::size_t>(keys));
        double top = -1e300, z = 0.0;
        for (std::int64_t j = 0; j < keys; ++j) {
          double score = 0.0;
          for (std::int64_t d = 0; d < hs; ++d) score += at(b, i, 0, h, d) * at(b, j, 1, h, d);
          weight[static_cast<std::size_t>(j)] = score / std::sqrt(static_cast<double>(hs));
          top = std::max(top, weight[static_cast<std::size_t>(j)]);
        }
        for (auto& w : weight) z += (w = std::exp(w - top));
        for (std::int64_t j = 0; j < keys; ++j) {
          double w = weight[static_cast<std::size_t>(j)] / z;
          if (p > 0.0f) {
            const auto index = static_cast<std::uint64_t>(((b * heads + h) * t + i) * t + j);
            w = random_uniform(seed, index) < p ? 0.0 : w * static_cast<double>(1.0f / (1.0f - p));
          }
          for (std::int64_t d = 0; d < hs; ++d) y[static_cast<std::size_t>((b * t + i) * c + h * hs + d)] += w * at(b, j, 2, h, d);
        }
      }
  return y;
}

// Class indices 0, 1, 2, 0, 1, ... for cross-entropy over 3 classes.
inline std::vector<float> ce_targets(std::size_t rows) {
  std::vector<float> t(rows);
  for (std::size_t i = 0; i < rows; ++i) t[i] = static_cast<float>(i % 3);
  return t;
}

inline std::vector<OpCase> op_cases() {
  auto add_f = [](double x, double y) { return x + y; };
  auto sub_f = [](double x, double y) { return x - y; };
  auto mul_f = [](double x, double y) { return x * y; };
  std::vector<OpCase> cases;
  cases.push_back({"add", {{3, 4}, {3, 4}}, [](auto& in) { return add(in[0], in[1]); },
                   [=](auto& v) { return broadcast_binary(v[0], v[1], add_f); }});
  cases.push_back({"add_bias_broadcast", {{5, 4}, {4}}, [](auto& in) { return add(in[0], in[1]); },
                   [=](auto& v) { return broadcast_binary(v[0], v[1], add_f); }});
  cases.push_back({"sub_scalar_broadcast", {{1}, {2, 3}}, [](auto& in) { return sub(in[0], in[1]); },
                   [=](auto& v) { return broadcast_binary(v[0], v[1], sub_f); }});
  cases.push_back({"mul", {{2, 5}, {2, 5}}, [](auto& in) { return mul(in[0], in[1]); },
                   [=](auto& v) { return broadcast_binary(v[0], v[1], mul_f); }});
  cases.push_back({"mul_row_broadcast", {{3, 4}, {1, 4}}, [](auto& in) { return mul(in[0], in[1]); },
                   [=](auto& v) { return broadcast_binary(v[0], v[1], mul_f); }});
  cases.push_back({"scale", {{7}}, [](auto& in) { return scale(in[0], -1.5f); },
                   [](auto& v) { Values o = v[0]; for (auto& x : o) x *= -1.5; return o; }});
  for (int t = 0; t < 4; ++t) {
    bool ta = t & 1, tb = t & 2;
    std::int64_t m = 3, k = 5, n = 4;
    Shape sa = ta ? Shape{k, m} : Shape{m, k}, sb = tb ? Shape{n, k} : Shape{k, n};
    cases.push_back({std::string("matmul") + (ta ? "_ta" : "") + (tb ? "_tb" : ""), {sa, sb},
                     [=](auto& in) { return matmul(in[0], in[1], ta, tb); },
                     [=](auto& v) { return reference_matmul(v[0], v[1], m, k, n, ta, tb); }});
  }
  cases.push_back({"sum", {{4, 3}}, [](auto& in) { return sum(in[0]); }, [](auto& v) { return Values{total(v[0])}; }});
  cases.push_back({"mean", {{4, 3}}, [](auto& in) { return mean(in[0]); },
                   [](auto& v) { return Values{total(v[0]) / static_cast<double>(v[0].size())}; }});
  cases.push_back({"relu", {{3, 5}}, [](auto& in) { return relu(in[0]); },
                   [](auto& v) { Values o = v[0]; for (auto& x : o) x = x > 0 ? x : 0; return o; }});
  cases.push_back({"gelu", {{3, 5}}, [](auto& in) { return gelu(in[0]); },
                   [](auto& v) { Values o = v[0]; for (auto& x : o) x = reference_gelu(x); return o; }});
  cases.push_back({"gelu_tanh", {{3, 5}}, [](auto& in) { return gelu(in[0], GeluApproximate::tanh); },
                   [](auto& v) { Values o = v[0]; for (auto& x : o) x = reference_gelu_tanh(x); return o; }});
  // Batched products, every transposition, batch 2 of 3x5 by 5x4.
  for (int t = 0; t < 4; ++t) {
    bool ta = t & 1, tb = t & 2;
    std::int64_t m = 3, k = 5, n = 4;
    Shape sa = ta ? Shape{2, k, m} : Shape{2, m, k}, sb = tb ? Shape{2, n, k} : Shape{2, k, n};
    cases.push_back({std::string("bmm") + (ta ? "_ta" : "") + (tb ? "_tb" : ""), {sa, sb},
                     [=](auto& in) { return bmm(in[0], in[1], ta, tb); },
                     [=](auto& v) {
                       Values out;
                       for (std::size_t i = 0; i < 2; ++i) {
                         Values a(v[0].begin() + static_cast<std::ptrdiff_t>(i * 15), v[0].begin() + static_cast<std::ptrdiff_t>((i + 1) * 15));
                         Values b(v[1].begin() + static_cast<std::ptrdiff_t>(i * 20), v[1].begin() + static_cast<std::ptrdiff_t>((i + 1) * 20));
                         Values c = reference_matmul(a, b, m, k, n, ta, tb);
                         out.insert(out.end(), c.begin(), c.end());
                       }
                       return out;
                     }});
  }
  // Softmax over rows of 5, plain and causal (2 score matrices of 5 x 5: row i sees columns 0..i).
  for (bool causal : {false, true})
    cases.push_back({causal ? "softmax_causal" : "softmax", {{2, 5, 5}},
                     [=](auto& in) { return softmax(in[0], causal); },
                     [=](auto& v) {
                       Values y(v[0].size(), 0.0);
                       for (std::size_t r = 0; r < 10; ++r) {
                         const std::size_t visible = causal ? r % 5 + 1 : 5;
                         double z = 0;
                         for (std::size_t c = 0; c < visible; ++c) z += std::exp(v[0][r * 5 + c]);
                         for (std::size_t c = 0; c < visible; ++c) y[r * 5 + c] = std::exp(v[0][r * 5 + c]) / z;
                       }
                       return y;
                     }});
  // Self-attention on the packed projection: causal and full, 2 sequences of 5 tokens, 2 heads of 3; with
  // dropout; and a causal sequence of 70 tokens, longer than the CPU kernel's blocks of 64 queries, so the
  // blocks above the diagonal are skipped and the keys' gradients add up over two blocks.
  for (bool causal : {true, false})
    cases.push_back({causal ? "attention_causal" : "attention_full", {{2, 5, 18}},
                     [=](auto& in) { return scaled_dot_product_attention(in[0], 2, causal); },
                     [=](auto& v) { return reference_attention(v[0], 2, 5, 2, 3, causal); }});
  cases.push_back({"attention_dropout", {{1, 4, 12}},
                   [](auto& in) { return scaled_dot_product_attention(in[0], 2, true, 0.3f, 5); },
                   [](auto& v) { return reference_attention(v[0], 1, 4, 2, 2, true, 0.3f, 5); }});
  cases.push_back({"attention_causal_70", {{1, 70, 12}},
                   [](auto& in) { return scaled_dot_product_attention(in[0], 2, true); },
                   [](auto& v) { return reference_attention(v[0], 1, 70, 2, 2, true); }});
  // Cross-entropy with two of five rows ignored (-100): the mean is over the other three.
  cases.push_back({"cross_entropy_ignore", {{5, 3}},
                   [](auto& in) {
                     return cross_entropy(in[0], Tensor::from_host({0, -100, 2, -100, 1}, {5}, in[0].device()));
                   },
                   [](auto& v) {
                     const int t[] = {0, -1, 2, -1, 1};
                     double s = 0;
                     for (std::size_t r = 0; r < 5; ++r) {
                       if (t[r] < 0) continue;
                       double z = 0;
                       for (std::size_t c = 0; c < 3; ++c) z += std::exp(v[0][r * 3 + c]);
                       s += std::log(z) - v[0][r * 3 + static_cast<std::size_t>(t[r])];
                     }
                     return Values{s / 3.0};
                   }});
  // Dropout's mask is a function of (seed, index): the reference draws the same one.
  cases.push_back({"dropout", {{4, 5}}, [](auto& in) { return dropout(in[0], 0.3f, 5); },
                   [](auto& v) {
                     Values y = v[0];
                     for (std::size_t i = 0; i < y.size(); ++i)
                       y[i] = random_uniform(5, i) < 0.3 ? 0.0 : y[i] * static_cast<double>(1.0f / 0.7f);
                     return y;
                   }});
  // Permute [2, 3, 4] to [4, 2, 3] (dims 2, 0, 1), and the middle row of 3 of [3, 2, 2].
  cases.push_back({"permute", {{2, 3, 4}}, [](auto& in) { return permute(in[0], {2, 0, 1}); },
                   [](auto& v) {
                     Values y;
                     for (std::size_t k = 0; k < 4; ++k)
                       for (std::size_t i = 0; i < 2; ++i)
                         for (std::size_t j = 0; j < 3; ++j) y.push_back(v[0][i * 12 + j * 4 + k]);
                     return y;
                   }});
  cases.push_back({"narrow", {{3, 2, 2}}, [](auto& in) { return narrow(in[0], 1, 1); },
                   [](auto& v) { return Values(v[0].begin() + 4, v[0].begin() + 8); }});
  // Layer norm over rows of 6, straight from the definition.
  cases.push_back({"layer_norm", {{4, 6}, {6}, {6}}, [](auto& in) { return layer_norm(in[0], in[1], in[2]); },
                   [](auto& v) {
                     Values y(v[0].size());
                     for (std::size_t r = 0; r < 4; ++r) {
                       double mu = 0, var = 0;
                       for (std::size_t c = 0; c < 6; ++c) mu += v[0][r * 6 + c] / 6.0;
                       for (std::size_t c = 0; c < 6; ++c) var += (v[0][r * 6 + c] - mu) * (v[0][r * 6 + c] - mu) / 6.0;
                       for (std::size_t c = 0; c < 6; ++c)
                         y[r * 6 + c] = (v[0][r * 6 + c] - mu) / std::sqrt(var + 1e-5) * v[1][c] + v[2][c];
                     }
                     return y;
                   }});
  // An embedding of 5 rows of 3, looked up at ids with repeats (2 twice, 4 three times), as [2, 4].
  cases.push_back({"embedding", {{5, 3}},
                   [](auto& in) {
                     return embedding(Tensor::from_host({2, 0, 4, 2, 4, 1, 4, 3}, {2, 4}, in[0].device()), in[0]);
                   },
                   [](auto& v) {
                     const std::size_t ids[] = {2, 0, 4, 2, 4, 1, 4, 3};
                     Values y;
                     for (std::size_t id : ids)
                       for (std::size_t d = 0; d < 3; ++d) y.push_back(v[0][id * 3 + d]);
                     return y;
                   }});
  // Every case of NumPy's broadcasting table, both ways round, with each op's own gradient rule.
  for (const auto& bc : numpy_broadcast_cases())
    for (bool swapped : {false, true}) {
      const Shape sa = swapped ? bc.b : bc.a, sb = swapped ? bc.a : bc.b;
      std::string name = "broadcast_" + shape_string(sa) + "_" + shape_string(sb);
      for (char& c : name)
        if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
      cases.push_back({name + "_sub", {sa, sb}, [](auto& in) { return sub(in[0], in[1]); },
                       [=](auto& v) { return numpy_binary(v[0], sa, v[1], sb, sub_f); }});
      cases.push_back({name + "_mul", {sa, sb}, [](auto& in) { return mul(in[0], in[1]); },
                       [=](auto& v) { return numpy_binary(v[0], sa, v[1], sb, mul_f); }});
    }
  cases.push_back({"reshape", {{2, 6}}, [](auto& in) { return reshape(in[0], {3, 4}); }, [](auto& v) { return v[0]; }});
  cases.push_back({"linear", {{4, 3}, {2, 3}, {2}}, [](auto& in) { return linear(in[0], in[1], in[2]); },
                   [](auto& v) {
                     Values y = reference_matmul(v[0], v[1], 4, 3, 2, false, true);
                     for (std::size_t i = 0; i < y.size(); ++i) y[i] += v[2][i % 2];
                     return y;
                   }});
  // torch.nn.functional.linear's leading dimensions: [2, 4, 3] is four rows in each of two batches.
  cases.push_back({"linear_3d", {{2, 4, 3}, {5, 3}, {5}}, [](auto& in) { return linear(in[0], in[1], in[2]); },
                   [](auto& v) {
                     Values y = reference_matmul(v[0], v[1], 8, 3, 5, false, true);
                     for (std::size_t i = 0; i < y.size(); ++i) y[i] += v[2][i % 5];
                     return y;
                   }});
  cases.push_back({"linear_no_bias", {{4, 3}, {2, 3}}, [](auto& in) { return linear(in[0], in[1], Tensor()); },
                   [](auto& v) { return reference_matmul(v[0], v[1], 4, 3, 2, false, true); }});
  cases.push_back({"mse_loss", {{6, 1}, {6, 1}}, [](auto& in) { return mse_loss(in[0], in[1]); },
                   [](auto& v) {
                     double s = 0;
                     for (std::size_t i = 0; i < v[0].size(); ++i) s += (v[0][i] - v[1][i]) * (v[0][i] - v[1][i]);
                     return Values{s / static_cast<double>(v[0].size())};
                   }});
  cases.push_back({"cross_entropy", {{5, 3}},
                   [](auto& in) { return cross_entropy(in[0], Tensor::from_host(ce_targets(5), {5}, in[0].device())); },
                   [](auto& v) {
                     auto t = ce_targets(5);
                     double s = 0;
                     for (std::size_t r = 0; r < 5; ++r) {
                       double z = 0;
                       for (std::size_t c = 0; c < 3; ++c) z += std::exp(v[0][r * 3 + c]);
                       s += std::log(z) - v[0][r * 3 + static_cast<std::size_t>(t[r])];
                     }
                     return Values{s / 5.0};
                   }});
  return cases;
}

}  // namespace course::testing
