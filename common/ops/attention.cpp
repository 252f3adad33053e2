// Scaled dot-product attention, the op: FlashAttention where sdpa_kernel.h picks it (the GPU's default),
// else the math kernel with its probabilities kept for backward (or recomputed: selective recomputation).
// 16-bit tensors are widened a slice of sequences at a time, so the float32 copies stay a fraction of
// what is kept, or read and written where they lie (FlashAttention's 16-bit kernels).
#include <stdexcept>

#include "common/autograd/autograd.h"
#include "common/autograd/profiler.h"
#include "common/kernels/kernels.h"
#include "common/ops/autocast.h"
#include "common/ops/ops.h"
#include "common/ops/sdpa_kernel.h"

namespace course {
using autograd::profiler::RecordFunction;
namespace {

// A float32 operand for a float32 kernel: a 16-bit tensor widened (exactly), a float32 one as it is.
Tensor widened(const Tensor& t) { return t.to(DType::float32); }

}  // namespace

namespace {

// Views of one slice of sequences [first, first + count) of attention's tensors.
struct Slices {
  const AttentionShape& whole;
  std::int64_t first, count;
  Tensor tokens(const Tensor& t, std::int64_t width) const {  // [B, T, width] -> [count, T, width]
    return t.view(static_cast<std::size_t>(first * whole.tokens * width), {count, whole.tokens, width});
  }
  Tensor probs(const Tensor& t) const {  // [B, H, T, T] -> [count, H, T, T]
    const std::int64_t per = whole.heads * whole.tokens * whole.tokens;
    return t.view(static_cast<std::size_t>(first * per), {count, whole.heads, whole.tokens, whole.tokens});
  }
};

// Calls `f` for slices of the batch (kernels.h): the whole batch in float32 (no copies to bound), an
// eighth of it at a time in 16 bits.
template <class F>
void for_sequence_slices(const AttentionShape& s, DType type, F f) {
  course::for_sequence_slices(s, is_16bit(type) ? (s.batch + 7) / 8 : s.batch,
                              [&](const AttentionShape& part, std::int64_t first) { f(part, Slices{s, first, part.batch}); });
}

// The attention kernel over the batch into `y`, returning the probabilities, both in qkv's type (the
// probabilities are what backward needs: in 16 bits the largest thing attention keeps, half float32's
// bytes). The kernels compute in float32; a 16-bit input is widened a slice of sequences at a time, so
// that the float32 copies stay a fraction of what is kept.
Tensor attention_forward(const Tensor& qkv, const AttentionShape& s, Tensor& y) {
  const DType type = qkv.dtype();
  Tensor probs = Tensor::empty({s.batch, s.heads, s.tokens, s.tokens}, qkv.device(), type);
  for_sequence_slices(s, type, [&](const AttentionShape& part, const Slices& at) {
    Tensor p32 = at.probs(probs), y32 = at.tokens(y, s.heads * s.head_size);
    if (is_16bit(type)) p32 = Tensor::empty(p32.shape(), qkv.device()), y32 = Tensor::empty(y32.shape(), qkv.device());
    kernels(qkv.device()).attention(widened(at.tokens(qkv, qkv.dim(2))).data(), part, p32.data(), y32.data());
    if (is_16bit(type)) at.probs(probs).copy_from(p32), at.tokens(y, s.heads * s.head_size).copy_from(y32);
  });
  return probs;
}

// FlashAttention (sdpa_kernel.h): y as attention_forward's, and each row's log-sum-exp [B, H, T] in float32,
// all that its backward keeps beside qkv and y. 16-bit tensors are read and written where they lie
// (Kernels::flash_attention_half).
Tensor flash_attention(const Tensor& qkv, const AttentionShape& s, Tensor& y) {
  Tensor lse = Tensor::empty({s.batch, s.heads, s.tokens}, qkv.device());
  Kernels& k = kernels(qkv.device());
  if (is_16bit(qkv.dtype()))
    k.flash_attention_half(half_format(qkv.dtype()), qkv.data16(), s, lse.data(), y.data16());
  else
    k.flash_attention(qkv.data(), s, lse.data(), y.data());
  return lse;
}

Tensor flash_attention_backward(const Tensor& qkv, const Tensor& y, const Tensor& lse, const Tensor& g,
                                const AttentionShape& s) {
  Tensor grad = Tensor::empty(qkv.shape(), qkv.device(), qkv.dtype());
  Kernels& k = kernels(qkv.device());
  if (is_16bit(qkv.dtype()) && g.dtype() == qkv.dtype())
    k.flash_attention_backward_half(half_format(qkv.dtype()), qkv.data16(), y.data16(), lse.data(), g.data16(), s,
                                    grad.data16());
  else {  // float32, or a gradient of another type than qkv's
    Tensor g32 = is_16bit(grad.dtype()) ? Tensor::empty(qkv.shape(), qkv.device()) : grad;
    k.flash_attention_backward(widened(qkv).data(), widened(y).data(), lse.data(), widened(g).data(), s, g32.data());
    if (is_16bit(grad.dtype())) grad.copy_from(g32);
  }
  return grad;
}

}  // namespace

Tensor scaled_dot_product_attention(const Tensor& qkv_in, std::int64_t n_head, bool is_causal, float dropout_p,
                                    std::uint64_t seed, bool keep_probabilities) {
  RecordFunction timed("attention");
  const Tensor qkv = autocast_input("attention", qkv_in);
  if (qkv.shape().size() != 3 || n_head < 1 || qkv.dim(2) % (3 * n_head) != 0)
    throw std::invalid_argument("scaled_dot_product_attention: qkv must be [B, T, 3C] with C a multiple of " +
                                std::to_string(n_head) + " heads, got " + shape_string(qkv.shape()));
  if (!(dropout_p >= 0.0f && dropout_p < 1.0f))
    throw std::invalid_argument("scaled_dot_product_attention: dropout_p = " + std::to_string(dropout_p) +
                                " outside [0, 1)");
  AttentionShape s;
  s.batch = qkv.dim(0), s.tokens = qkv.dim(1), s.heads = n_head, s.head_size = qkv.dim(2) / (3 * n_head);
  s.causal = is_causal, s.dropout = dropout_p, s.seed = seed;
  Tensor y = Tensor::empty({s.batch, s.tokens, s.heads * s.head_size}, qkv.device(), qkv.dtype());
  if (sdp_backend(qkv.device(), s.head_size) == SdpBackend::flash_attention) {
    const Tensor lse = flash_attention(qkv, s, y);
    round_kept(y, emulated_kept_type());  // its backward reads y as the 16-bit path keeps it
    return autocast_output("attention", autograd::record(y, "attention", {qkv}, [qkv = qkv.detach(), y = y.detach(), lse, s](const Tensor& g) {
      return std::vector<Tensor>{flash_attention_backward(qkv, y, lse, g, s)};
    }));
  }
  Tensor probs = attention_forward(qkv, s, y);
  const DType kept_type = emulated_kept_type();  // its backward reads the probabilities as the 16-bit path keeps them
  round_kept(probs, kept_type);
  if (!keep_probabilities) probs = Tensor();  // selective recomputation: computed again in backward
  return autocast_output("attention", autograd::record(y, "attention", {qkv}, [qkv = qkv.detach(), kept = probs, s, kept_type](const Tensor& g) {
    Tensor probs = kept;
    if (!probs.defined()) {  // the forward's kernel again, its probabilities rounded as the forward's were
      Tensor y = Tensor::empty({s.batch, s.tokens, s.heads * s.head_size}, qkv.device(), qkv.dtype());
      probs = attention_forward(qkv, s, y);
      round_kept(probs, kept_type);
    }
    Tensor grad = Tensor::empty(qkv.shape(), qkv.device(), qkv.dtype());
    for_sequence_slices(s, qkv.dtype(), [&](const AttentionShape& part, const Slices& at) {
      Tensor g32 = is_16bit(grad.dtype()) ? Tensor::empty({part.batch, s.tokens, qkv.dim(2)}, qkv.device())
                                          : at.tokens(grad, qkv.dim(2));
      kernels(qkv.device()).attention_backward(widened(at.tokens(qkv, qkv.dim(2))).data(), widened(at.probs(probs)).data(),
                                               widened(at.tokens(g, s.heads * s.head_size)).data(), part, g32.data());
      if (is_16bit(grad.dtype())) at.tokens(grad, qkv.dim(2)).copy_from(g32);
    });
    return std::vector<Tensor>{grad};
  }));
}

}  // namespace course
