// Primitive ops: each computes its output with a kernel and records the rule for its gradient.
// Element types: the GEMMs run on 16-bit operands as 16-bit GEMMs (float32 accumulation); the
// element-wise kernels on operands of one 16-bit type read and write 16 bits (Kernels::unary_half,
// binary_half); every other kernel reads 16-bit operands widened to float32. Either way each value is
// computed in float32 and rounded once to the op's output type, which is its inputs' widest (PyTorch's
// type promotion). The engine rounds each gradient to its tensor's type. Autocast (autocast.h) casts the
// inputs first, by its table.
#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "common/autograd/autograd.h"
#include "common/autograd/profiler.h"
#include "common/kernels/kernels.h"
#include "common/ops/autocast.h"
#include "common/ops/kernel_faults.h"  // --fault truncating-gelu, ce-next-row: on the 16-bit paths
#include "common/ops/ops.h"
#include "common/ops/sdpa_kernel.h"

namespace course {
using autograd::profiler::RecordFunction;
namespace {

std::size_t count(const Tensor& t) { return static_cast<std::size_t>(t.numel()); }

// A float32 operand for a float32 kernel: a 16-bit tensor widened (exactly), a float32 one as it is.
Tensor wide(const Tensor& t) { return t.to(DType::float32); }

// Fills `out` through `f(first, count, result)`, which computes elements [first, first + count) in
// float32 into `result`. A float32 `out` is filled in one call, in place; a 16-bit one a slice at a
// time through a float32 scratch, each slice rounded into `out` once: the kernels compute in float32,
// and the float32 copies of a 16-bit op's operands then stay an eighth of the tensor (or 4K elements)
// rather than twice its size, which is what keeps mixed precision's activation memory near half.
// Slicing an element-wise op changes none of its arithmetic. `row`: slices hold whole rows of that many
// elements.
template <class F>
void in_wide_slices(Tensor& out, F f, std::size_t row = 1) {
  const auto n = static_cast<std::size_t>(out.numel());
  if (!is_16bit(out.dtype())) {
    if (n) f(0, n, out.data());
    return;
  }
  std::size_t step = std::max<std::size_t>(std::size_t{1} << 12, (n + 7) / 8);
  step = (step + row - 1) / row * row;
  for (std::size_t first = 0; first < n; first += step) {
    const std::size_t count = std::min(step, n - first);
    Tensor scratch = Tensor::empty({static_cast<std::int64_t>(count)}, out.device());
    f(first, count, scratch.data());
    out.flat_view(first, count).copy_from(scratch);
  }
}

// C = op(A) op(B), a new [m, n] tensor (of `shape`) in `dtype`: a 16-bit GEMM with float32 accumulation
// when dtype is a 16-bit type, otherwise float32's on the widened operands.
Tensor gemm_into(DType dtype, bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, const Tensor& a,
                 const Tensor& b, const Shape& shape) {
  Tensor c = Tensor::empty(shape, a.device(), dtype);
  Kernels& kernel = kernels(a.device());
  if (is_16bit(dtype))
    kernel.gemm_half(half_format(dtype), ta, tb, m, n, k, 1.0f, a.to(dtype).data16(), b.to(dtype).data16(), 0.0f,
                     c.data16());
  else
    kernel.gemm(ta, tb, m, n, k, 1.0f, wide(a).data(), wide(b).data(), 0.0f, c.data());
  return c;
}

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
  const Tensor g = wide(grad);
  Tensor out = Tensor::empty(shape, g.device());
  if (repeats_as_suffix(shape, grad.shape())) {
    kernels(g.device()).sum_rows(g.data(), count(g) / static_cast<std::size_t>(n), static_cast<std::size_t>(n),
                                 out.data());
  } else {
    kernels(g.device()).sum_to(g.data(), out.data(), count(out), broadcast_index(g.shape(), shape, shape));
  }
  return out.to(grad.dtype());
}

Tensor binary_forward(BinaryOp op, const Tensor& a16, const Tensor& b16, const char* name) {
  check_same_device(a16, b16, name);
  const Shape shape = broadcast_shape(a16.shape(), b16.shape(), name);
  const bool repeats = repeats_as_suffix(a16.shape(), shape) && repeats_as_suffix(b16.shape(), shape);
  if (repeats && is_16bit(a16.dtype()) && b16.dtype() == a16.dtype()) {  // read and written in 16 bits
    Tensor out = Tensor::empty(shape, a16.device(), a16.dtype());
    kernels(a16.device()).binary_half(half_format(a16.dtype()), op, a16.data16(), count(a16), b16.data16(), count(b16),
                                      out.data16(), count(out));
    return out;
  }
  const Tensor a = wide(a16), b = wide(b16);
  Tensor out = Tensor::empty(shape, a.device());
  if (repeats)
    kernels(a.device()).binary(op, a.data(), count(a), b.data(), count(b), out.data(), count(out));
  else
    kernels(a.device()).binary_broadcast(op, a.data(), b.data(), out.data(), broadcast_index(shape, a.shape(), b.shape()));
  return out.to(promote_types(a16.dtype(), b16.dtype()));
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
  kernels(a.device()).scale(wide(a).data(), factor, out.data(), count(a));
  return autograd::record(out.to(a.dtype()), "scale", {a}, [factor](const Tensor& g) {
    return std::vector<Tensor>{scale(g, factor)};
  });
}

Tensor scale(const Tensor& a, const Tensor& factor) {
  RecordFunction timed("scale");
  check_same_device(a, factor, "scale");
  if (factor.numel() != 1 || factor.dtype() != DType::float32)
    throw std::invalid_argument("scale: the factor must be one float32 value, got " + shape_string(factor.shape()));
  Tensor out = Tensor::empty(a.shape(), a.device());
  kernels(a.device()).scale_by(wide(a).data(), factor.data(), out.data(), count(a));
  return autograd::record(out.to(a.dtype()), "scale", {a}, [factor = factor.detach()](const Tensor& g) {
    return std::vector<Tensor>{scale(g, factor)};
  });
}

Tensor arange(std::int64_t n, Device device) {
  Tensor out = Tensor::empty({n}, device);
  kernels(device).arange(out.data(), static_cast<std::size_t>(n));
  return out;
}

Tensor inverse_count(const Tensor& targets, int ignore_index) {
  Tensor inverse = Tensor::empty({1}, targets.device());
  kernels(targets.device()).inverse_count(wide(targets).data(), count(targets), static_cast<float>(ignore_index),
                                          inverse.data());
  return inverse;
}

Tensor matmul(const Tensor& a_in, const Tensor& b_in, bool ta, bool tb) {
  RecordFunction timed("matmul");
  const Tensor a = autocast_input("matmul", a_in), b = autocast_input("matmul", b_in);
  check_same_device(a, b, "matmul");
  if (a.shape().size() != 2 || b.shape().size() != 2)
    throw std::invalid_argument("matmul: needs 2-D operands, got " + shape_string(a.shape()) + " and " +
                                shape_string(b.shape()));
  std::int64_t m = ta ? a.dim(1) : a.dim(0), k = ta ? a.dim(0) : a.dim(1);
  std::int64_t kb = tb ? b.dim(1) : b.dim(0), n = tb ? b.dim(0) : b.dim(1);
  if (k != kb)
    throw std::invalid_argument("matmul: inner dimensions differ: " + shape_string(a.shape()) +
                                (ta ? "^T" : "") + " x " + shape_string(b.shape()) + (tb ? "^T" : ""));
  Tensor out = gemm_into(promote_types(a.dtype(), b.dtype()), ta, tb, m, n, k, a, b, {m, n});
  // C = op(A) op(B): dA = dC op(B)^T (transposed back if A was), dB likewise. An operand that needs no
  // gradient (the data) gets none: its GEMM is skipped, as PyTorch skips it by ctx.needs_input_grad.
  return autocast_output("matmul", autograd::record(out, "matmul", {a, b},
                          [a = a.detach(), b = b.detach(), ta, tb, need_a = a.requires_grad(),
                           need_b = b.requires_grad()](const Tensor& g) {
                            Tensor ga, gb;
                            if (need_a && autograd::input_wanted(0)) ga = ta ? matmul(b, g, tb, true) : matmul(g, b, false, !tb);
                            if (need_b && autograd::input_wanted(1)) gb = tb ? matmul(g, a, true, ta) : matmul(a, g, !ta, false);
                            return std::vector<Tensor>{ga, gb};
                          },
                          {false, true}));  // the second operand, a weight where one is (a tied head's table)
}

Tensor linear(const Tensor& x_in, const Tensor& weight_in, const Tensor& bias_in) {
  RecordFunction timed("linear");
  const Tensor x = autocast_input("linear", x_in), weight = autocast_input("linear", weight_in),
               bias = autocast_input("linear", bias_in);
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
  DType dtype = promote_types(x.dtype(), weight.dtype());
  if (bias.defined()) dtype = promote_types(dtype, bias.dtype());
  Tensor out = Tensor::empty(out_shape, x.device(), dtype);
  Kernels& k = kernels(x.device());
  // torch.addmm's fusion: the output starts as the bias, row after row, and the GEMM adds x W^T to it
  // (beta = 1), so the bias costs no pass of its own over the output. In 16 bits the bias rows are exact
  // (the bias was 16-bit).
  if (bias.defined() && rows > 0) {
    const Tensor b = wide(bias);
    in_wide_slices(out, [&](std::size_t, std::size_t n, float* result) {
      BroadcastIndex rows_of_bias;
      rows_of_bias.rank = 2;
      rows_of_bias.dims[0] = static_cast<std::int64_t>(n) / out_features;
      rows_of_bias.dims[1] = out_features;
      rows_of_bias.a_strides[1] = 1;
      k.gather(b.data(), result, rows_of_bias);
    }, static_cast<std::size_t>(out_features));
  }
  const float beta = bias.defined() ? 1.0f : 0.0f;
  if (is_16bit(dtype)) {
    k.gemm_half(half_format(dtype), false, true, rows, out_features, in, 1.0f, x.data16(), weight.data16(), beta,
                out.data16());
  } else {
    k.gemm(false, true, rows, out_features, in, 1.0f, wide(x).data(), wide(weight).data(), beta, out.data());
  }
  std::vector<Tensor> inputs{x, weight};
  if (bias.defined()) inputs.push_back(bias);
  // Backward needs the weight as the forward used it. Where autocast cast a float32 weight, the float32
  // weight is kept instead and cast again in backward (the same bits: nothing changes a weight between a
  // forward and its backward), so no 16-bit copy of a weight lives from forward to backward: PyTorch's
  // autocast caches the copy for the scope instead. A weight that is not float32 is kept as it is.
  const bool recast = weight_in.dtype() != weight.dtype() && weight_in.dtype() == DType::float32;
  return autocast_output("linear", autograd::record(out, "linear", inputs,
                          [x = x.detach(), kept = (recast ? weight_in : weight).detach(), recast, weight_type = weight.dtype(),
                           has_bias = bias.defined(), rows, in, out_features, need_x = x.requires_grad(),
                           need_w = weight.requires_grad(), dtype](const Tensor& g) {
                            const Tensor w = recast ? kept.to(weight_type) : kept;
                            Kernels& k = kernels(g.device());
                            std::vector<Tensor> grads(has_bias ? 3 : 2);
                            // In 16 bits (the forward's type) when the forward was: the GEMMs of the
                            // backward take the same operands, as PyTorch's do under autocast.
                            const DType type = is_16bit(dtype) && x.dtype() == dtype && w.dtype() == dtype
                                                   ? dtype : DType::float32;
                            if (need_x && autograd::input_wanted(0))  // dx = dy W
                              grads[0] = gemm_into(type, false, false, rows, in, out_features, g, w, x.shape());
                            if (need_w && autograd::input_wanted(1))  // dW = dy^T x
                              grads[1] = gemm_into(type, true, false, out_features, in, rows, g, x, w.shape());
                            if (has_bias && autograd::input_wanted(2)) {  // db = the column sums of dy, in float32
                              grads[2] = Tensor::empty({out_features}, g.device());
                              k.sum_rows(wide(g).data(), static_cast<std::size_t>(rows),
                                         static_cast<std::size_t>(out_features), grads[2].data());
                            }
                            return grads;
                          },
                          {false, true, true}));  // the weight's and the bias's may wait (zero-bubble's W)
}

Tensor bmm(const Tensor& a_in, const Tensor& b_in, bool ta, bool tb) {
  RecordFunction timed("bmm");
  const Tensor a = autocast_input("bmm", a_in), b = autocast_input("bmm", b_in);
  check_same_device(a, b, "bmm");
  if (a.shape().size() != 3 || b.shape().size() != 3 || a.dim(0) != b.dim(0))
    throw std::invalid_argument("bmm: needs 3-D operands with the same batch, got " + shape_string(a.shape()) +
                                " and " + shape_string(b.shape()));
  const std::int64_t batch = a.dim(0), m = ta ? a.dim(2) : a.dim(1), k = ta ? a.dim(1) : a.dim(2);
  const std::int64_t kb = tb ? b.dim(2) : b.dim(1), n = tb ? b.dim(1) : b.dim(2);
  if (k != kb)
    throw std::invalid_argument("bmm: inner dimensions differ: " + shape_string(a.shape()) + (ta ? "^T" : "") +
                                " x " + shape_string(b.shape()) + (tb ? "^T" : ""));
  const DType dtype = promote_types(a.dtype(), b.dtype());
  Tensor out = Tensor::empty({batch, m, n}, a.device(), dtype);
  if (is_16bit(dtype))
    kernels(a.device()).gemm_batched_half(half_format(dtype), ta, tb, batch, m, n, k, 1.0f, a.data16(), m * k,
                                          b.data16(), k * n, 0.0f, out.data16(), m * n);
  else
    kernels(a.device()).gemm_batched(ta, tb, batch, m, n, k, 1.0f, wide(a).data(), m * k, wide(b).data(), k * n, 0.0f,
                                     out.data(), m * n);
  // The matmul rule, matrix by matrix.
  return autocast_output("bmm", autograd::record(out, "bmm", {a, b}, [a = a.detach(), b = b.detach(), ta, tb](const Tensor& g) {
    Tensor ga = ta ? bmm(b, g, tb, true) : bmm(g, b, false, !tb);
    Tensor gb = tb ? bmm(g, a, true, ta) : bmm(a, g, !ta, false);
    return std::vector<Tensor>{ga, gb};
  }));
}

Tensor sum(const Tensor& a_in) {
  RecordFunction timed("sum");
  const Tensor a = autocast_input("sum", a_in);
  Tensor out = Tensor::empty({1}, a.device());
  kernels(a.device()).sum(wide(a).data(), count(a), out.data());
  return autograd::record(out.to(a.dtype()), "sum", {a}, [shape = a.shape()](const Tensor& g) {
    Tensor expanded = Tensor::zeros(shape, g.device());
    kernels(g.device()).binary(BinaryOp::add, expanded.data(), count(expanded), wide(g).data(), 1, expanded.data(),
                               count(expanded));
    return std::vector<Tensor>{expanded};
  });
}

Tensor mean(const Tensor& a) {
  if (a.numel() == 0) throw std::invalid_argument("mean of an empty tensor");
  return scale(sum(a), 1.0f / static_cast<float>(a.numel()));
}

namespace {
// In 16 bits the kernels read and write the 16-bit values themselves (Kernels::unary_half).
Tensor unary_op(UnaryOp op, const Tensor& a, const char* name) {
  RecordFunction timed(name);
  Tensor out = Tensor::empty(a.shape(), a.device(), a.dtype());
  if (is_16bit(a.dtype())) {
    kernels(a.device()).unary_half(half_format(a.dtype()), op, a.data16(), out.data16(), count(a));
    truncating_gelu_fault(op, a, Tensor(), out);
  } else
    kernels(a.device()).unary(op, a.data(), out.data(), count(a));
  return autograd::record(out, name, {a}, [op, a = a.detach()](const Tensor& g) {
    Tensor grad = Tensor::empty(a.shape(), a.device(), a.dtype());
    if (is_16bit(a.dtype()) && g.dtype() == a.dtype()) {
      kernels(a.device()).unary_backward_half(half_format(a.dtype()), op, a.data16(), g.data16(), grad.data16(), count(a));
      truncating_gelu_fault(op, a, g, grad);
      return std::vector<Tensor>{grad};
    }
    in_wide_slices(grad, [&](std::size_t first, std::size_t n, float* result) {
      kernels(a.device()).unary_backward(op, wide(a.flat_view(first, n)).data(), wide(g.flat_view(first, n)).data(),
                                         result, n);
    });
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
  kernels(a.device()).gather(wide(a).data(), out.data(), index);
  out = out.to(a.dtype());
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
  Tensor out = Tensor::empty(shape, a.device(), a.dtype());
  out.copy_from(a.flat_view(static_cast<std::size_t>(start) * row, count(out)));
  return autograd::record(out, "narrow", {a}, [full = a.shape(), start, row](const Tensor& g) {
    Tensor grad = Tensor::zeros(full, g.device(), g.dtype());  // the rows it did not take get no gradient
    grad.flat_view(static_cast<std::size_t>(start) * row, count(g)).copy_from(g);
    return std::vector<Tensor>{grad};
  });
}

Tensor softmax(const Tensor& x_in, bool causal) {
  RecordFunction timed(causal ? "causal_softmax" : "softmax");
  const Tensor x = autocast_input("softmax", x_in);
  if (x.shape().empty()) throw std::invalid_argument("softmax: needs at least one dimension");
  const auto cols = static_cast<std::size_t>(x.shape().back());
  if (causal && (x.shape().size() < 2 || x.dim(static_cast<int>(x.shape().size()) - 2) != x.shape().back()))
    throw std::invalid_argument("softmax: a causal mask needs square last two dimensions, got " +
                                shape_string(x.shape()));
  const std::size_t rows = cols ? count(x) / cols : 0;
  Tensor y = Tensor::empty(x.shape(), x.device());
  kernels(x.device()).softmax(wide(x).data(), rows, cols, causal, y.data());
  y = y.to(x.dtype());
  return autograd::record(y, causal ? "causal_softmax" : "softmax", {x}, [y = y.detach(), rows, cols](const Tensor& g) {
    Tensor dx = Tensor::empty(y.shape(), y.device());
    kernels(y.device()).softmax_backward(wide(y).data(), wide(g).data(), rows, cols, dx.data());
    return std::vector<Tensor>{dx};
  });
}

Tensor dropout(const Tensor& x, float p, std::uint64_t seed) {
  if (!(p >= 0.0f && p < 1.0f)) throw std::invalid_argument("dropout: p = " + std::to_string(p) + " outside [0, 1)");
  if (p == 0.0f) return x;
  RecordFunction timed("dropout");
  // Each element times 0 or 1 / (1 - p), its factor drawn from (seed, its index) where x is (never a mask
  // made on the host and copied), the product taken in float32 and rounded once to x's type. Backward
  // draws the same factors again instead of keeping them.
  const std::size_t n = count(x);
  Tensor out = Tensor::empty(x.shape(), x.device());
  kernels(x.device()).dropout(wide(x).data(), out.data(), n, p, seed, 0);
  return autograd::record(out.to(x.dtype()), "dropout", {x}, [p, seed, n, type = x.dtype()](const Tensor& g) {
    Tensor grad = Tensor::empty(g.shape(), g.device());
    kernels(g.device()).dropout(wide(g).data(), grad.data(), n, p, seed, 0);
    return std::vector<Tensor>{grad.to(type)};
  });
}

Tensor layer_norm(const Tensor& x_in, const Tensor& weight_in, const Tensor& bias_in, float eps) {
  RecordFunction timed("layer_norm");
  const Tensor x = autocast_input("layer_norm", x_in), weight = autocast_input("layer_norm", weight_in),
               bias = autocast_input("layer_norm", bias_in);
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
  kernels(x.device()).layer_norm(wide(x).data(), wide(weight).data(), wide(bias).data(), rows, cols, eps, out.data(),
                                 mean.data(), rstd.data());
  return autograd::record(out.to(x.dtype()), "layer_norm", {x, weight, bias},
                          [x = x.detach(), w = weight.detach(), mean, rstd, rows, cols](const Tensor& g) {
                            Tensor gx = Tensor::empty(x.shape(), x.device());
                            Tensor gw = Tensor::empty(w.shape(), x.device()), gb = Tensor::empty(w.shape(), x.device());
                            kernels(x.device()).layer_norm_backward(wide(x).data(), wide(w).data(), mean.data(),
                                                                    rstd.data(), wide(g).data(), rows, cols, gx.data(),
                                                                    gw.data(), gb.data());
                            return std::vector<Tensor>{gx, gw, gb};
                          });
}

Tensor embedding(const Tensor& ids, const Tensor& weight) {
  RecordFunction timed("embedding");
  check_same_device(ids, weight, "embedding");
  if (weight.shape().size() != 2)
    throw std::invalid_argument("embedding: weight must be [vocab, dim], got " + shape_string(weight.shape()));
  const auto vocab = static_cast<std::size_t>(weight.dim(0)), dim = static_cast<std::size_t>(weight.dim(1));
  // Checked where the ids are: on a GPU the host hears of a bad one at its next read, without waiting now.
  kernels(ids.device()).check_indices(IndexCheck::embedding_index, wide(ids).data(), count(ids), vocab, NAN);
  Shape shape = ids.shape();
  shape.push_back(weight.dim(1));
  Tensor out = Tensor::empty(shape, weight.device());
  kernels(weight.device()).embedding(wide(ids).data(), wide(weight).data(), count(ids), dim, vocab, out.data());
  return autograd::record(out.to(weight.dtype()), "embedding", {ids, weight}, [ids = ids.detach(), vocab, dim, wshape = weight.shape()](
                                                               const Tensor& g) {
    Tensor gw = Tensor::empty(wshape, g.device());
    kernels(g.device()).embedding_backward(wide(ids).data(), wide(g).data(), count(ids), dim, vocab, gw.data());
    return std::vector<Tensor>{Tensor(), gw};
  });
}

namespace {

// 16-bit logits read as they are (Kernels::cross_entropy_half): the losses and the 16-bit gradient are
// the bits of the float32 path on their widening (the gradient rounded once, as its cast would round
// it), without the float32 copies. The loss is float32 under autocast (its float32 policy), else of the
// logits' type, as the float32 path gives them.
Tensor cross_entropy_half_rows(const Tensor& logits, const Tensor& targets, std::size_t rows, std::size_t cols) {
  const Device device = logits.device();
  Tensor losses = Tensor::empty({logits.dim(0)}, device);
  Tensor top = Tensor::empty({logits.dim(0)}, device), total = Tensor::empty({2 * logits.dim(0)}, device);  // doubles
  const HalfFormat format = half_format(logits.dtype());
  kernels(device).cross_entropy_half(format, logits.data16(), wide(targets).data(), rows, cols, losses.data(),
                                     top.data(), reinterpret_cast<double*>(total.data()));
  const DType loss_type = autocast_dtype() == DType::float32 ? logits.dtype() : DType::float32;
  return autograd::record(losses.to(loss_type), "cross_entropy", {logits, targets},
                          [logits = logits.detach(), targets = targets.detach(), top, total, format, rows,
                           cols](const Tensor& g) {
                            Tensor grad = Tensor::empty(logits.shape(), logits.device(), logits.dtype());
                            kernels(logits.device())
                                .cross_entropy_backward_half(format, logits.data16(), wide(ce_next_row_fault(targets)).data(), wide(g).data(),
                                                             top.data(), reinterpret_cast<const double*>(total.data()),
                                                             rows, cols, grad.data16());
                            return std::vector<Tensor>{grad, Tensor()};
                          });
}

}  // namespace

Tensor cross_entropy_per_row(const Tensor& logits_in, const Tensor& targets, int ignore_index) {
  RecordFunction timed("cross_entropy");
  if (ignore_index >= 0)
    throw std::invalid_argument("cross_entropy: ignore_index " + std::to_string(ignore_index) +
                                " must be negative (the kernels skip negative targets)");
  check_same_device(logits_in, targets, "cross_entropy");
  if (logits_in.shape().size() != 2 || targets.numel() != logits_in.dim(0))
    throw std::invalid_argument("cross_entropy: logits " + shape_string(logits_in.shape()) + " and targets " +
                                shape_string(targets.shape()) + " do not match");
  auto rows = static_cast<std::size_t>(logits_in.dim(0)), cols = static_cast<std::size_t>(logits_in.dim(1));
  kernels(targets.device()).check_indices(IndexCheck::cross_entropy_target, wide(targets).data(), rows, cols,
                                          static_cast<float>(ignore_index));
  if (is_16bit(logits_in.dtype())) return cross_entropy_half_rows(logits_in, targets, rows, cols);
  const Tensor logits = autocast_input("cross_entropy", logits_in);
  Tensor losses = Tensor::empty({logits.dim(0)}, logits.device());
  kernels(logits.device()).cross_entropy(wide(logits).data(), wide(targets).data(), rows, cols, losses.data());
  return autograd::record(losses.to(logits.dtype()), "cross_entropy", {logits, targets},
                          [logits = logits.detach(), targets = targets.detach(), rows, cols](const Tensor& g) {
                            Tensor grad = Tensor::empty(logits.shape(), logits.device());
                            kernels(logits.device())
                                .cross_entropy_backward(wide(logits).data(), wide(targets).data(), wide(g).data(), rows,
                                                        cols, grad.data());
                            return std::vector<Tensor>{grad, Tensor()};
                          });
}

Tensor cast(const Tensor& x, DType dtype) {
  if (x.dtype() == dtype) return x;
  return autograd::record(x.to(dtype), "cast", {x}, [from = x.dtype()](const Tensor& g) {
    return std::vector<Tensor>{g.to(from)};
  });
}

}  // namespace course
