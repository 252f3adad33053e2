// Differentiable ops on tensors. Primitive ops have a hand-written backward rule (ops.cpp);
// the losses are composed from them (losses.cpp), so their gradients come for free.
#pragma once
#include "common/tensor/tensor.h"

namespace course {

// Broadcasting follows NumPy's rule (and PyTorch's): shapes are aligned from the right, a dimension of
// size 1 (or a missing one) stretches to the other's size, and the result has the larger rank:
// [1, 1, 5] + [4, 5] is [1, 4, 5], [8, 1, 6, 1] * [7, 1, 5] is [8, 7, 6, 5]. Gradients are summed back
// to each operand's own shape. Incompatible shapes throw std::invalid_argument naming both.
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor scale(const Tensor& a, float factor);
// a times the one value of `factor` (one float32 where a is; not differentiated): a scale that the host
// never reads, as a mean's divisor counted on the device.
Tensor scale(const Tensor& a, const Tensor& factor);
// torch.arange(n): 0, 1, ..., n - 1 as floats (exact below 2^24), made on `device`.
Tensor arange(std::int64_t n, Device device = Device::cpu);
// 1 / (the number of targets other than ignore_index), one float32 where the targets are: the divisor of
// a mean over the rows not ignored. Every target ignored is an error (std::invalid_argument; on a GPU at
// the host's next read of a tensor).
Tensor inverse_count(const Tensor& targets, int ignore_index);
Tensor matmul(const Tensor& a, const Tensor& b, bool transpose_a = false, bool transpose_b = false);
// torch.bmm: [B, M, K] x [B, K, N] -> [B, M, N]; either operand may be transposed in its last two dims.
Tensor bmm(const Tensor& a, const Tensor& b, bool transpose_a = false, bool transpose_b = false);
Tensor sum(const Tensor& a);  // all elements, to shape [1]
Tensor mean(const Tensor& a);
Tensor relu(const Tensor& a);
// GELU as PyTorch names it: approximate = none is the exact x * Phi(x) (nn.GELU's default),
// tanh the approximation GPT-2 used (nn.GELU(approximate="tanh")).
enum class GeluApproximate { none, tanh };
Tensor gelu(const Tensor& a, GeluApproximate approximate = GeluApproximate::none);
Tensor reshape(const Tensor& a, const Shape& shape);
// torch.permute: output dimension d is input dimension dims[d] (a copy, contiguous).
Tensor permute(const Tensor& a, const std::vector<int>& dims);
// torch.narrow(a, 0, start, length): rows start .. start + length - 1 of the first dimension (a copy).
Tensor narrow(const Tensor& a, std::int64_t start, std::int64_t length);
// Softmax over the last dimension. With `causal`, the last two dimensions are a square score matrix
// and query i sees keys 0..i only, as is_causal in F.scaled_dot_product_attention.
Tensor softmax(const Tensor& x, bool causal = false);
// F.scaled_dot_product_attention(q, k, v, dropout_p, is_causal) for self-attention, taking what nanoGPT's
// c_attn writes: qkv [B, T, 3C] holds q, k and v side by side, each C = n_head x head_size wide with the
// heads next to each other. Returns [B, T, C], the heads side by side again (what c_proj reads), so the
// split, the views and the transposes around PyTorch's call are not needed: the kernel reads the packed
// layout in place. Scores are scaled by 1/sqrt(head_size); dropout_p drops probabilities with a mask drawn
// from `seed` as the dropout op draws it. Ours differs from PyTorch's in taking q, k and v packed.
// Two kernels compute it (sdpa_kernel.h): FlashAttention, which keeps only each row's log-sum-exp (a GPU's
// default), and the math kernel, which keeps the probabilities (the CPU's). For the math kernel,
// `keep_probabilities` false is selective recomputation (Korthikanti et al., "Reducing Activation
// Recomputation in Large Transformer Models", 2022): the [B, H, T, T] probabilities, the largest thing
// attention keeps, are not kept but computed again in backward from qkv (the same bits: the same
// kernel on the same input, rounded as the kept ones would have been).
Tensor scaled_dot_product_attention(const Tensor& qkv, std::int64_t n_head, bool is_causal = true,
                                    float dropout_p = 0.0f, std::uint64_t seed = 0, bool keep_probabilities = true);
// nn.Dropout in training mode: each element is zeroed with probability p and the rest scaled by
// 1 / (1 - p). The mask is a pure function of (seed, element index), the same on every device and
// every run; p = 0 returns x itself.
Tensor dropout(const Tensor& x, float p, std::uint64_t seed);
// nn.LayerNorm over the last dimension: (x - mean) / sqrt(var + eps) * weight + bias, the variance biased.
Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps = 1e-5f);
// nn.Embedding: `ids` (indices stored as floats, any shape) picks rows of weight [vocab, dim]; the result
// has shape ids.shape + [dim]. Only the weight has a gradient (a deterministic scatter-add).
Tensor embedding(const Tensor& ids, const Tensor& weight);
// [N, C], [N] -> [N]: log-sum-exp minus the target's logit, fused (no separate softmax is stored).
// Rows whose target is ignore_index (negative, PyTorch's default -100) get loss 0 and no gradient.
Tensor cross_entropy_per_row(const Tensor& logits, const Tensor& targets, int ignore_index = -100);

// nn.functional.linear: x W^T + b for x of shape [..., in], W [out, in], b [out] or undefined. The bias
// is added inside the GEMM (beta = 1), as torch.addmm does.
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias);

// x.to(dtype) recorded by autograd (torch's Tensor.to(dtype)): the gradient goes back in x's type.
// Returns x itself when it has that type already. Autocast's casts are these.
Tensor cast(const Tensor& x, DType dtype);

// Composed.
Tensor mse_loss(const Tensor& prediction, const Tensor& target);          // mean((p - t)^2)
// The mean over the rows not ignored, as PyTorch's F.cross_entropy(reduction="mean").
Tensor cross_entropy(const Tensor& logits, const Tensor& targets, int ignore_index = -100);

inline Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
inline Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
inline Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }

}  // namespace course
