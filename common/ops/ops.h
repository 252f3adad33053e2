// Differentiable ops on tensors. Primitive ops have a hand-written backward rule (ops.cpp);
// the losses are composed from them (losses.cpp), so their gradients come for free.
#pragma once
#include "common/tensor/tensor.h"

namespace course {

// Broadcasting: the smaller operand's shape must be a suffix of the larger's (a bias row [M] against
// [N, M], or a single value), and it is repeated over the leading dimensions.
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor scale(const Tensor& a, float factor);
Tensor matmul(const Tensor& a, const Tensor& b, bool transpose_a = false, bool transpose_b = false);
Tensor sum(const Tensor& a);  // all elements, to shape [1]
Tensor mean(const Tensor& a);
Tensor relu(const Tensor& a);
Tensor gelu(const Tensor& a);
Tensor reshape(const Tensor& a, const Shape& shape);
Tensor cross_entropy_per_row(const Tensor& logits, const Tensor& targets);  // [N, C], [N] -> [N]

// Composed.
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias);  // x W^T + b, W is [out, in]
Tensor mse_loss(const Tensor& prediction, const Tensor& target);          // mean((p - t)^2)
Tensor cross_entropy(const Tensor& logits, const Tensor& targets);        // mean over rows

inline Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
inline Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
inline Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }

}  // namespace course
