// The op table shared by the gradient and parity tests: each case builds inputs, runs the library op,
// and has an independent double-precision reference written with plain loops.
#pragma once
#include <cmath>
#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "common/ops/ops.h"

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

inline double reference_gelu(double x) {
  return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}

inline double total(const Values& v) {
  double s = 0.0;
  for (double x : v) s += x;
  return s;
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
  cases.push_back({"reshape", {{2, 6}}, [](auto& in) { return reshape(in[0], {3, 4}); }, [](auto& v) { return v[0]; }});
  cases.push_back({"linear", {{4, 3}, {2, 3}, {2}}, [](auto& in) { return linear(in[0], in[1], in[2]); },
                   [](auto& v) {
                     Values y = reference_matmul(v[0], v[1], 4, 3, 2, false, true);
                     for (std::size_t i = 0; i < y.size(); ++i) y[i] += v[2][i % 2];
                     return y;
                   }});
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
