// Primitive ops: each computes its output with a kernel and records the rule for its gradient.
#include <stdexcept>

#include "common/autograd/autograd.h"
#include "common/kernels/kernels.h"
#include "common/ops/ops.h"

namespace course {
namespace {

std::size_t count(const Tensor& t) { return static_cast<std::size_t>(t.numel()); }

void check_same_device(const Tensor& a, const Tensor& b, const char* op) {
  if (a.device() != b.device())
    throw std::invalid_argument(std::string(op) + ": operands on " + device_name(a.device()) + " and " +
                                device_name(b.device()));
}

// The shape of `a op b` under suffix broadcasting, or an exception naming both shapes.
Shape broadcast_shape(const Shape& a, const Shape& b, const char* op) {
  const Shape& big = shape_numel(a) >= shape_numel(b) ? a : b;
  const Shape& small = &big == &a ? b : a;
  if (shape_numel(small) == 1 && shape_numel(big) >= 1) return big;
  std::size_t lead = 0;
  while (lead < small.size() && small[lead] == 1 && small.size() - lead > 0) ++lead;
  Shape core(small.begin() + static_cast<std::ptrdiff_t>(lead), small.end());
  bool suffix = core.size() <= big.size() && std::equal(core.rbegin(), core.rend(), big.rbegin());
  if (!suffix || small.size() > big.size() + lead)
    throw std::invalid_argument(std::string(op) + ": shapes " + shape_string(a) + " and " + shape_string(b) +
                                " do not broadcast");
  return big;
}

// Sums a broadcast gradient back to the shape of the operand that was repeated.
Tensor reduce_to(const Tensor& grad, const Shape& shape) {
  std::int64_t n = shape_numel(shape);
  if (grad.numel() == n) return grad.view(0, shape);
  Tensor out = Tensor::empty(shape, grad.device());
  kernels(grad.device()).sum_rows(grad.data(), count(grad) / static_cast<std::size_t>(n), static_cast<std::size_t>(n),
                                  out.data());
  return out;
}

Tensor binary_forward(BinaryOp op, const Tensor& a, const Tensor& b, const char* name) {
  check_same_device(a, b, name);
  Tensor out = Tensor::empty(broadcast_shape(a.shape(), b.shape(), name), a.device());
  kernels(a.device()).binary(op, a.data(), count(a), b.data(), count(b), out.data(), count(out));
  return out;
}

}  // namespace

Tensor add(const Tensor& a, const Tensor& b) {
  Tensor out = binary_forward(BinaryOp::add, a, b, "add");
  return autograd::record(out, "add", {a, b}, [sa = a.shape(), sb = b.shape()](const Tensor& g) {
    return std::vector<Tensor>{reduce_to(g, sa), reduce_to(g, sb)};
  });
}

Tensor sub(const Tensor& a, const Tensor& b) {
  Tensor out = binary_forward(BinaryOp::sub, a, b, "sub");
  return autograd::record(out, "sub", {a, b}, [sa = a.shape(), sb = b.shape()](const Tensor& g) {
    return std::vector<Tensor>{reduce_to(g, sa), scale(reduce_to(g, sb), -1.0f)};
  });
}

Tensor mul(const Tensor& a, const Tensor& b) {
  Tensor out = binary_forward(BinaryOp::mul, a, b, "mul");
  return autograd::record(out, "mul", {a, b}, [a = a.detach(), b = b.detach()](const Tensor& g) {
    return std::vector<Tensor>{reduce_to(mul(g, b), a.shape()), reduce_to(mul(g, a), b.shape())};
  });
}

Tensor scale(const Tensor& a, float factor) {
  Tensor out = Tensor::empty(a.shape(), a.device());
  kernels(a.device()).scale(a.data(), factor, out.data(), count(a));
  return autograd::record(out, "scale", {a}, [factor](const Tensor& g) {
    return std::vector<Tensor>{scale(g, factor)};
  });
}

Tensor matmul(const Tensor& a, const Tensor& b, bool ta, bool tb) {
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
  // C = op(A) op(B): dA = dC op(B)^T (transposed back if A was), dB likewise.
  return autograd::record(out, "matmul", {a, b}, [a = a.detach(), b = b.detach(), ta, tb](const Tensor& g) {
    Tensor ga = ta ? matmul(b, g, tb, true) : matmul(g, b, false, !tb);
    Tensor gb = tb ? matmul(g, a, true, ta) : matmul(a, g, !ta, false);
    return std::vector<Tensor>{ga, gb};
  });
}

Tensor sum(const Tensor& a) {
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
Tensor gelu(const Tensor& a) { return unary_op(UnaryOp::gelu, a, "gelu"); }

Tensor reshape(const Tensor& a, const Shape& shape) {
  if (shape_numel(shape) != a.numel())
    throw std::invalid_argument("reshape: " + shape_string(a.shape()) + " to " + shape_string(shape));
  Tensor out = a.view(0, shape);
  return autograd::record(out, "reshape", {a}, [old = a.shape()](const Tensor& g) {
    return std::vector<Tensor>{g.view(0, old)};
  });
}

Tensor cross_entropy_per_row(const Tensor& logits, const Tensor& targets) {
  check_same_device(logits, targets, "cross_entropy");
  if (logits.shape().size() != 2 || targets.numel() != logits.dim(0))
    throw std::invalid_argument("cross_entropy: logits " + shape_string(logits.shape()) + " and targets " +
                                shape_string(targets.shape()) + " do not match");
  auto rows = static_cast<std::size_t>(logits.dim(0)), cols = static_cast<std::size_t>(logits.dim(1));
  for (float t : targets.to_host())
    if (!(t >= 0.0f && t < static_cast<float>(cols) && t == static_cast<float>(static_cast<long>(t))))
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
