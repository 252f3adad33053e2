// Primitive ops: each computes its output with a kernel and records the rule for its gradient.
#include <algorithm>
#include <stdexcept>

#include "common/autograd/autograd.h"
#include "common/autograd/profiler.h"
#include "common/kernels/kernels.h"
#include "common/tensor/random.h"
#include "common/ops/ops.h"

namespace course {
using autograd::profiler::RecordFunction;
namespace {

std::size_t count(const Tensor& t) { return static_cast<std::size_t>(t.numel()); }

void check_same_device(const Tensor& a, const Tensor& b, const char* op) {
  if (a.device() != b.device())
    throw std::invalid_argument(std::string(op) + ": operands on " + device_name(a.device()) + " and " +
                                device_name(b.device()));
}

// The shape of `a op b` by NumPy's rule: align the shapes from the right (the shorter padded with 1s on
// the left); in each dimension the sizes are equal or one is 1, which stretches; the result has the
// larger rank. Anything else is an error naming both shapes.
Shape broadcast_shape(const Shape& a, const Shape& b, const char* op) {
  const std::size_t rank = std::max(a.size(), b.size());
  if (rank > static_cast<std::size_t>(kMaxDims))
    throw std::invalid_argument(std::string(op) + ": shapes " + shape_string(a) + " and " + shape_string(b) +
                                " have more than " + std::to_string(kMaxDims) + " dimensions");
  Shape out(rank);
  for (std::size_t i = 0; i < rank; ++i) {  // i counts from the right
    const std::int64_t x = i < a.size() ? a[a.size() - 1 - i] : 1, y = i < b.size() ? b[b.size() - 1 - i] : 1;
    if (x != y && x != 1 && y != 1)
      throw std::invalid_argument(std::string(op) + ": shapes " + shape_string(a) + " and " + shape_string(b) +
                                  " do not broadcast (" + std::to_string(x) + " against " + std::to_string(y) +
                                  " in dimension " + std::to_string(i + 1) + " from the right)");
    out[rank - 1 - i] = x == 1 ? y : x;
  }
  return out;
}

// Whether `operand` is `out` itself or a repetition of its trailing dimensions (a bias row, a single
// value): then operand[i % n] is its element for out[i], the fast path of Kernels::binary.
bool repeats_as_suffix(const Shape& operand, const Shape& out) {
  std::size_t first = 0;  // leading 1s are only repetition
  while (first < operand.size() && operand[first] == 1) ++first;
  const std::size_t tail = operand.size() - first;
  return tail <= out.size() && std::equal(operand.begin() + static_cast<std::ptrdiff_t>(first), operand.end(),
                                          out.end() - static_cast<std::ptrdiff_t>(tail));
}

// Element strides of `operand` along the dimensions of `out`: 0 where it is repeated.
void strides_along(const Shape& operand, const Shape& out, std::int64_t* strides) {
  const std::size_t pad = out.size() - operand.size();
  std::int64_t stride = 1;
  for (std::size_t d = out.size(); d-- > 0;) {
    const std::int64_t size = d < pad ? 1 : operand[d - pad];
    strides[d] = size == 1 && out[d] != 1 ? 0 : stride;
    stride *= size;
  }
}

BroadcastIndex broadcast_index(const Shape& out, const Shape& a, const Shape& b) {
  BroadcastIndex index;
  index.rank = static_cast<int>(out.size());
  std::copy(out.begin(), out.end(), index.dims);
  strides_along(a, out, index.a_strides);
  strides_along(b, out, index.b_strides);
  return index;
}

// Sums a broadcast gradient back to the shape of the operand that was repeated.
Tensor reduce_to(const Tensor& grad, const Shape& shape) {
  std::int64_t n = shape_numel(shape);
  if (grad.numel() == n) return grad.view(0, shape);
  Tensor out = Tensor::empty(shape, grad.device());
  if (repeats_as_suffix(shape, grad.shape())) {
    kernels(grad.device()).sum_rows(grad.data(), count(grad) / static_cast<std::size_t>(n),
                                    static_cast<std::size_t>(n), out.data());
  } else {
    kernels(grad.device()).sum_to(grad.data(), out.data(), count(out), broadcast_index(grad.shape(), shape, shape));
  }
  return out;
}

Tensor binary_forward(BinaryOp op, const Tensor& a, const Tensor& b, const char* name) {
  check_same_device(a, b, name);
  const Shape shape = broadcast_shape(a.shape(), b.shape(), name);
  Tensor out = Tensor::empty(shape, a.device());
  if (repeats_as_suffix(a.shape(), shape) && repeats_as_suffix(b.shape(), shape))
    kernels(a.device()).binary(op, a.data(), count(a), b.data(), count(b), out.data(), count(out));
  else
    kernels(a.device()).binary_broadcast(op, a.data(), b.data(), out.data(), broadcast_index(shape, a.shape(), b.shape()));
  return out;
}

}  // namespace

Tensor add(const Tensor& a, const Tensor& b) {
  RecordFunction timed("add");
  Tensor out = binary_forward(BinaryOp::add, a, b, "add");
  return autograd::record(out, "add", {a, b}, [sa = a.shape(), sb = b.shape()](const Tensor& g) {
    return std::vector<Tensor>{reduce_to(g, sa), reduce_to(g, sb)};
  });
}

Tensor sub(const Tensor& a, const Tensor& b) {
  RecordFunction timed("sub");
  Tensor out = binary_forward(BinaryOp::sub, a, b, "sub");
  return autograd::record(out, "sub", {a, b}, [sa = a.shape(), sb = b.shape()](const Tensor& g) {
    return std::vector<Tensor>{reduce_to(g, sa), scale(reduce_to(g, sb), -1.0f)};
  });
}

Tensor mul(const Tensor& a, const Tensor& b) {
  RecordFunction timed("mul");
  Tensor out = binary_forward(BinaryOp::mul, a, b, "mul");
  return autograd::record(out, "mul", {a, b}, [a = a.detach(), b = b.detach()](const Tensor& g) {
    return std::vector<Tensor>{reduce_to(mul(g, b), a.shape()), reduce_to(mul(g, a), b.shape())};
  });
}

Tensor scale(const Tensor& a, float factor) {
  RecordFunction timed("scale");
  Tensor out = Tensor::empty(a.shape(), a.device());
  kernels(a.device()).scale(a.data(), factor, out.data(), count(a));
  return autograd::record(out, "scale", {a}, [factor](const Tensor& g) {
    return std::vector<Tensor>{scale(g, factor)};
  });
}

Tensor matmul(const Tensor& a, const Tensor& b, bool ta, bool tb) {
  RecordFunction timed("matmul");
  check_same_device(a, b, "matmul");
  if (a.shape().size() != 2 || b.shape().size() != 2)
    throw std::invalid_argument("matmul: needs 2-D operands, got " + shape_string(a.shape()) + " and " +
                                shape_string(b.shape()));
  std::int64_t m = ta ? a.dim(1) : a.dim(0), k = ta ? a.dim(0) : a.dim(1);
  std::int64_t kb = tb ? b.dim(1) : b.dim(0), n = tb ? b.dim(0) : b.dim(1);
  if (k != kb)
    throw std::invalid_argument("matmul: inner dimensions differ: " + shape_string(a.shape()) +
                                (ta ? "^T" : "") + " x " + shape_string(b.shape()) + (tb ? "^T" : ""));
  Tensor out = Tensor::empty({m, n}, a.device());
  kernels(a.device()).gemm(ta, tb, m, n, k, 1.0f, a.data(), b.data(), 0.0f, out.data());
  // C = op(A) op(B): dA = dC op(B)^T (transposed back if A was), dB likewise. An operand that needs no
  // gradient (the data) gets none: its GEMM is skipped, as PyTorch skips it by ctx.needs_input_grad.
  return autograd::record(out, "matmul", {a, b},
                          [a = a.detach(), b = b.detach(), ta, tb, need_a = a.requires_grad(),
                           need_b = b.requires_grad()](const Tensor& g) {
                            Tensor ga, gb;
                            if (need_a) ga = ta ? matmul(b, g, tb, true) : matmul(g, b, false, !tb);
                            if (need_b) gb = tb ? matmul(g, a, true, ta) : matmul(a, g, !ta, false);
                            return std::vector<Tensor>{ga, gb};
                          });
}

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  RecordFunction timed("linear");
  check_same_device(x, weight, "linear");
  if (weight.shape().size() != 2 || x.shape().empty() || x.shape().back() != weight.dim(1) ||
      (bias.defined() && (bias.shape() != Shape{weight.dim(0)} || bias.device() != x.device())))
    throw std::invalid_argument("linear: input " + shape_string(x.shape()) + ", weight " +
                                shape_string(weight.shape()) + " and bias " +
                                (bias.defined() ? shape_string(bias.shape()) : std::string("none")) +
                                " do not fit (weight is [out, in], bias [out])");
  const std::int64_t in = weight.dim(1), out_features = weight.dim(0);
  std::int64_t rows = 1;  // every leading dimension of x
  for (std::size_t d = 0; d + 1 < x.shape().size(); ++d) rows *= x.shape()[d];
  Shape out_shape = x.shape();
  out_shape.back() = out_features;
  Tensor out = Tensor::empty(out_shape, x.device());
  Kernels& k = kernels(x.device());
  // torch.addmm's fusion: the output starts as the bias, row after row, and the GEMM adds x W^T to it
  // (beta = 1), so the bias costs no pass of its own over the output.
  if (bias.defined() && rows > 0) {
    BroadcastIndex rows_of_bias;
    rows_of_bias.rank = 2;
    rows_of_bias.dims[0] = rows;
    rows_of_bias.dims[1] = out_features;
    rows_of_bias.a_strides[1] = 1;
    k.gather(bias.data(), out.data(), rows_of_bias);
  }
  k.gemm(false, true, rows, out_features, in, 1.0f, x.data(), weight.data(), bias.defined() ? 1.0f : 0.0f, out.data());
  std::vector<Tensor> inputs{x, weight};
  if (bias.defined()) inputs.push_back(bias);
  return autograd::record(out, "linear", inputs,
                          [x = x.detach(), w = weight.detach(), has_bias = bias.defined(), rows, in, out_features,
                           need_x = x.requires_grad(), need_w = weight.requires_grad()](const Tensor& g) {
                            Kernels& k = kernels(g.device());
                            std::vector<Tensor> grads(has_bias ? 3 : 2);
                            if (need_x) {  // dx = dy W
                              grads[0] = Tensor::empty(x.shape(), g.device());
                              k.gemm(false, false, rows, in, out_features, 1.0f, g.data(), w.data(), 0.0f,
                                     grads[0].data());
                            }
                            if (need_w) {  // dW = dy^T x
                              grads[1] = Tensor::empty(w.shape(), g.device());
                              k.gemm(true, false, out_features, in, rows, 1.0f, g.data(), x.data(), 0.0f,
                                     grads[1].data());
                            }
                            if (has_bias) {  // db = the column sums of dy
                              grads[2] = Tensor::empty({out_features}, g.device());
                              k.sum_rows(g.data(), static_cast<std::size_t>(rows),
                                         static_cast<std::size_t>(out_features), grads[2].data());
                            }
                            return grads;
                          });
}

Tensor bmm(const Tensor& a, const Tensor& b, bool ta, bool tb) {
  RecordFunction timed("bmm");
  check_same_device(a, b, "bmm");
  if (a.shape().size() != 3 || b.shape().size() != 3 || a.dim(0) != b.dim(0))
    throw std::invalid_argument("bmm: needs 3-D operands with the same batch, got " + shape_string(a.shape()) +
                                " and " + shape_string(b.shape()));
  const std::int64_t batch = a.dim(0), m = ta ? a.dim(2) : a.dim(1), k = ta ? a.dim(1) : a.dim(2);
  const std::int64_t kb = tb ? b.dim(2) : b.dim(1), n = tb ? b.dim(1) : b.dim(2);
  if (k != kb)
    throw std::invalid_argument("bmm: inner dimensions differ: " + shape_string(a.shape()) + (ta ? "^T" : "") +
                                " x " + shape_string(b.shape()) + (tb ? "^T" : ""));
  Tensor out = Tensor::empty({batch, m, n}, a.device());
  kernels(a.device()).gemm_batched(ta, tb, batch, m, n, k, 1.0f, a.data(), m * k, b.data(), k * n, 0.0f, out.data(),
                                   m * n);
  // The matmul rule, matrix by matrix.
  return autograd::record(out, "bmm", {a, b}, [a = a.detach(), b = b.detach(), ta, tb](const Tensor& g) {
    Tensor ga = ta ? bmm(b, g, tb, true) : bmm(g, b, false, !tb);
    Tensor gb = tb ? bmm(g, a, true, ta) : bmm(a, g, !ta, false);
    return std::vector<Tensor>{ga, gb};
  });
}

Tensor sum(const Tensor& a) {
  RecordFunction timed("sum");
  Tensor out = Tensor::empty({1}, a.device());
  kernels(a.device()).sum(a.data(), count(a), out.data());
  return autograd::record(out, "sum", {a}, [shape = a.shape()](const Tensor& g) {
    Tensor expanded = Tensor::zeros(shape, g.device());
    kernels(g.device()).binary(BinaryOp::add, expanded.data(), count(expanded), g.data(), 1, expanded.data(),
                               count(expanded));
    return std::vector<Tensor>{expanded};
  });
}

Tensor mean(const Tensor& a) {
  if (a.numel() == 0) throw std::invalid_argument("mean of an empty tensor");
  return scale(sum(a), 1.0f / static_cast<float>(a.numel()));
}

namespace {
Tensor unary_op(UnaryOp op, const Tensor& a, const char* name) {
  RecordFunction timed(name);
  Tensor out = Tensor::empty(a.shape(), a.device());
  kernels(a.device()).unary(op, a.data(), out.data(), count(a));
  return autograd::record(out, name, {a}, [op, a = a.detach()](const Tensor& g) {
    Tensor grad = Tensor::empty(a.shape(), a.device());
    kernels(a.device()).unary_backward(op, a.data(), g.data(), grad.data(), count(a));
    return std::vector<Tensor>{grad};
  });
}
}  // namespace

Tensor relu(const Tensor& a) { return unary_op(UnaryOp::relu, a, "relu"); }
Tensor gelu(const Tensor& a, GeluApproximate approximate) {
  return approximate == GeluApproximate::none ? unary_op(UnaryOp::gelu, a, "gelu") : unary_op(UnaryOp::gelu_tanh, a, "gelu_tanh");
}

Tensor reshape(const Tensor& a, const Shape& shape) {
  if (shape_numel(shape) != a.numel())
    throw std::invalid_argument("reshape: " + shape_string(a.shape()) + " to " + shape_string(shape));
  Tensor out = a.view(0, shape);
  return autograd::record(out, "reshape", {a}, [old = a.shape()](const Tensor& g) {
    return std::vector<Tensor>{g.view(0, old)};
  });
}

Tensor permute(const Tensor& a, const std::vector<int>& dims) {
  RecordFunction timed("permute");
  const std::size_t rank = a.shape().size();
  std::vector<bool> seen(rank, false);
  bool valid = dims.size() == rank && rank <= static_cast<std::size_t>(kMaxDims);
  for (int d : dims) {
    valid = valid && d >= 0 && static_cast<std::size_t>(d) < rank && !seen[static_cast<std::size_t>(d)];
    if (valid) seen[static_cast<std::size_t>(d)] = true;
  }
  if (!valid) throw std::invalid_argument("permute: " + std::to_string(dims.size()) + " dimensions do not permute " +
                                          shape_string(a.shape()));
  std::vector<std::int64_t> in_strides(rank);
  for (std::size_t d = rank, stride = 1; d-- > 0;) {
    in_strides[d] = static_cast<std::int64_t>(stride);
    stride *= static_cast<std::size_t>(a.shape()[d]);
  }
  BroadcastIndex index;
  index.rank = static_cast<int>(rank);
  Shape shape(rank);
  for (std::size_t d = 0; d < rank; ++d) {
    shape[d] = a.shape()[static_cast<std::size_t>(dims[d])];
    index.dims[d] = shape[d];
    index.a_strides[d] = in_strides[static_cast<std::size_t>(dims[d])];
  }
  Tensor out = Tensor::empty(shape, a.device());
  kernels(a.device()).gather(a.data(), out.data(), index);
  std::vector<int> inverse(rank);
  for (std::size_t d = 0; d < rank; ++d) inverse[static_cast<std::size_t>(dims[d])] = static_cast<int>(d);
  return autograd::record(out, "permute", {a}, [inverse](const Tensor& g) {
    return std::vector<Tensor>{permute(g, inverse)};
  });
}

Tensor narrow(const Tensor& a, std::int64_t start, std::int64_t length) {
  RecordFunction timed("narrow");
  if (a.shape().empty() || start < 0 || length < 0 || start + length > a.dim(0))
    throw std::invalid_argument("narrow: rows " + std::to_string(start) + " to " + std::to_string(start + length) +
                                " of " + shape_string(a.shape()));
  Shape shape = a.shape();
  shape[0] = length;
  const std::size_t row = a.dim(0) ? count(a) / static_cast<std::size_t>(a.dim(0)) : 0;
  Tensor out = Tensor::empty(shape, a.device());
  kernels(a.device()).copy(out.data(), a.data() + static_cast<std::size_t>(start) * row, count(out));
  return autograd::record(out, "narrow", {a}, [full = a.shape(), start, row](const Tensor& g) {
    Tensor grad = Tensor::zeros(full, g.device());  // the rows it did not take get no gradient
    kernels(g.device()).copy(grad.data() + static_cast<std::size_t>(start) * row, g.data(), count(g));
    return std::vector<Tensor>{grad};
  });
}

Tensor softmax(const Tensor& x, bool causal) {
  RecordFunction timed(causal ? "causal_softmax" : "softmax");
  if (x.shape().empty()) throw std::invalid_argument("softmax: needs at least one dimension");
  const auto cols = static_cast<std::size_t>(x.shape().back());
  if (causal && (x.shape().size() < 2 || x.dim(static_cast<int>(x.shape().size()) - 2) != x.shape().back()))
    throw std::invalid_argument("softmax: a causal mask needs square last two dimensions, got " +
                                shape_string(x.shape()));
  const std::size_t rows = cols ? count(x) / cols : 0;
  Tensor y = Tensor::empty(x.shape(), x.device());
  kernels(x.device()).softmax(x.data(), rows, cols, causal, y.data());
  return autograd::record(y, causal ? "causal_softmax" : "softmax", {x}, [y = y.detach(), rows, cols](const Tensor& g) {
    Tensor dx = Tensor::empty(y.shape(), y.device());
    kernels(y.device()).softmax_backward(y.data(), g.data(), rows, cols, dx.data());
    return std::vector<Tensor>{dx};
  });
}

Tensor scaled_dot_product_attention(const Tensor& qkv, std::int64_t n_head, bool is_causal, float dropout_p,
                                    std::uint64_t seed) {
  RecordFunction timed("attention");
  if (qkv.shape().size() != 3 || n_head < 1 || qkv.dim(2) % (3 * n_head) != 0)
    throw std::invalid_argument("scaled_dot_product_attention: qkv must be [B, T, 3C] with C a multiple of " +
                                std::to_string(n_head) + " heads, got " + shape_string(qkv.shape()));
  if (!(dropout_p >= 0.0f && dropout_p < 1.0f))
    throw std::invalid_argument("scaled_dot_product_attention: dropout_p = " + std::to_string(dropout_p) +
                                " outside [0, 1)");
  AttentionShape s;
  s.batch = qkv.dim(0), s.tokens = qkv.dim(1), s.heads = n_head, s.head_size = qkv.dim(2) / (3 * n_head);
  s.causal = is_causal, s.dropout = dropout_p, s.seed = seed;
  Tensor probs = Tensor::empty({s.batch, s.heads, s.tokens, s.tokens}, qkv.device());
  Tensor y = Tensor::empty({s.batch, s.tokens, s.heads * s.head_size}, qkv.device());
  kernels(qkv.device()).attention(qkv.data(), s, probs.data(), y.data());
  return autograd::record(y, "attention", {qkv}, [qkv = qkv.detach(), probs, s](const Tensor& g) {
    Tensor grad = Tensor::empty(qkv.shape(), qkv.device());
    kernels(qkv.device()).attention_backward(qkv.data(), probs.data(), g.data(), s, grad.data());
    return std::vector<Tensor>{grad};
  });
}

Tensor dropout(const Tensor& x, float p, std::uint64_t seed) {
  if (!(p >= 0.0f && p < 1.0f)) throw std::invalid_argument("dropout: p = " + std::to_string(p) + " outside [0, 1)");
  if (p == 0.0f) return x;
  // The kept elements' scale, 1 / (1 - p), or 0: a mask that the forward and the backward both multiply by.
  std::vector<float> keep(count(x));
  for (std::size_t i = 0; i < keep.size(); ++i) keep[i] = random_uniform(seed, i) < p ? 0.0f : 1.0f / (1.0f - p);
  return mul(x, Tensor::from_host(keep, x.shape(), x.device()));
}

Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps) {
  RecordFunction timed("layer_norm");
  check_same_device(x, weight, "layer_norm");
  check_same_device(x, bias, "layer_norm");
  if (x.shape().empty() || weight.shape() != Shape{x.shape().back()} || bias.shape() != weight.shape())
    throw std::invalid_argument("layer_norm: input " + shape_string(x.shape()) + ", weight " +
                                shape_string(weight.shape()) + " and bias " + shape_string(bias.shape()) +
                                " do not match (weight and bias must be [last dimension])");
  if (!(eps > 0.0f)) throw std::invalid_argument("layer_norm: eps must be positive");
  const auto cols = static_cast<std::size_t>(x.shape().back());
  const std::size_t rows = cols ? count(x) / cols : 0;
  Tensor out = Tensor::empty(x.shape(), x.device());
  Tensor mean = Tensor::empty({static_cast<std::int64_t>(rows)}, x.device());
  Tensor rstd = Tensor::empty({static_cast<std::int64_t>(rows)}, x.device());
  kernels(x.device()).layer_norm(x.data(), weight.data(), bias.data(), rows, cols, eps, out.data(), mean.data(),
                                 rstd.data());
  return autograd::record(out, "layer_norm", {x, weight, bias},
                          [x = x.detach(), w = weight.detach(), mean, rstd, rows, cols](const Tensor& g) {
                            Tensor gx = Tensor::empty(x.shape(), x.device());
                            Tensor gw = Tensor::empty(w.shape(), x.device()), gb = Tensor::empty(w.shape(), x.device());
                            kernels(x.device()).layer_norm_backward(x.data(), w.data(), mean.data(), rstd.data(),
                                                                    g.data(), rows, cols, gx.data(), gw.data(),
                                                                    gb.data());
                            return std::vector<Tensor>{gx, gw, gb};
                          });
}

Tensor embedding(const Tensor& ids, const Tensor& weight) {
  RecordFunction timed("embedding");
  check_same_device(ids, weight, "embedding");
  if (weight.shape().size() != 2)
    throw std::invalid_argument("embedding: weight must be [vocab, dim], got " + shape_string(weight.shape()));
  const auto vocab = static_cast<std::size_t>(weight.dim(0)), dim = static_cast<std::size_t>(weight.dim(1));
  for (float id : ids.to_host())
    if (!(id >= 0.0f && id < static_cast<float>(vocab) && id == static_cast<float>(static_cast<long>(id))))
      throw std::invalid_argument("embedding: index " + std::to_string(id) + " is not a row below " +
                                  std::to_string(vocab));
  Shape shape = ids.shape();
  shape.push_back(weight.dim(1));
  Tensor out = Tensor::empty(shape, weight.device());
  kernels(weight.device()).embedding(ids.data(), weight.data(), count(ids), dim, out.data());
  return autograd::record(out, "embedding", {ids, weight}, [ids = ids.detach(), vocab, dim, wshape = weight.shape()](
                                                               const Tensor& g) {
    Tensor gw = Tensor::empty(wshape, g.device());
    kernels(g.device()).embedding_backward(ids.data(), g.data(), count(ids), dim, vocab, gw.data());
    return std::vector<Tensor>{Tensor(), gw};
  });
}

Tensor cross_entropy_per_row(const Tensor& logits, const Tensor& targets, int ignore_index) {
  RecordFunction timed("cross_entropy");
  if (ignore_index >= 0)
    throw std::invalid_argument("cross_entropy: ignore_index " + std::to_string(ignore_index) +
                                " must be negative (the kernels skip negative targets)");
  check_same_device(logits, targets, "cross_entropy");
  if (logits.shape().size() != 2 || targets.numel() != logits.dim(0))
    throw std::invalid_argument("cross_entropy: logits " + shape_string(logits.shape()) + " and targets " +
                                shape_string(targets.shape()) + " do not match");
  auto rows = static_cast<std::size_t>(logits.dim(0)), cols = static_cast<std::size_t>(logits.dim(1));
  for (float t : targets.to_host())
    if (t != static_cast<float>(ignore_index) &&
        !(t >= 0.0f && t < static_cast<float>(cols) && t == static_cast<float>(static_cast<long>(t))))
      throw std::invalid_argument("cross_entropy: target " + std::to_string(t) + " is not a class index below " +
                                  std::to_string(cols));
  Tensor losses = Tensor::empty({logits.dim(0)}, logits.device());
  kernels(logits.device()).cross_entropy(logits.data(), targets.data(), rows, cols, losses.data());
  return autograd::record(losses, "cross_entropy", {logits, targets},
                          [logits = logits.detach(), targets = targets.detach(), rows, cols](const Tensor& g) {
                            Tensor grad = Tensor::empty(logits.shape(), logits.device());
                            kernels(logits.device())
                                .cross_entropy_backward(logits.data(), targets.data(), g.data(), rows, cols, grad.data());
                            return std::vector<Tensor>{grad, Tensor()};
                          });
}

}  // namespace course
