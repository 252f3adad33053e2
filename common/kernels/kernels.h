// The op kernels, declared once. The CPU backend is the reference (cpu_kernels.h: a file per op family);
// the CUDA backend implements the same interface for the GPU, family by family (cuda_kernels.h), and
// tests/kernel_parity_*.cpp check one against the other, a file to a family.
// Kernels take raw pointers and sizes; shapes, broadcasting rules and autograd live in common/ops.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/core/device.h"
#include "common/core/index_check.h"

namespace course {

enum class BinaryOp { add, sub, mul, max };
// gelu is the exact form, 0.5 x (1 + erf(x / sqrt 2)), PyTorch's default; gelu_tanh its tanh
// approximation (PyTorch's approximate="tanh", the one GPT-2 uses).
enum class UnaryOp { relu, gelu, gelu_tanh };
enum class HalfFormat { float16, bfloat16 };  // 16-bit storage (common/kernels/half.h)

struct SgdParams {
  float lr, momentum, weight_decay;
};
struct AdamParams {
  float lr, beta1, beta2, eps;
  bool decoupled_weight_decay;       // AdamW (Loshchilov & Hutter, 2019) when true
  float bias_correction1, bias_correction2;  // 1 - beta^t, computed by the optimizer
  bool zero_grad = false;            // each gradient element set to 0 once read (zero_grad folded in)
};
// One tensor of an Adam step (or one piece of one: a ZeRO shard's segment), with its group's weight decay.
struct AdamTensor {
  float* param;
  float* grad;  // written only with AdamParams::zero_grad
  float* m;
  float* v;
  std::size_t n;
  float weight_decay;
};

// Causal (or full) multi-head self-attention on the packed projection [batch, tokens, 3, heads, head_size]
// (q, k and v side by side, each heads x head_size wide, as nanoGPT's c_attn writes them). Scores are
// scaled by 1/sqrt(head_size), as F.scaled_dot_product_attention does by default. With dropout > 0 a
// probability is kept with 1 - dropout and scaled by 1/(1 - dropout), its mask a pure function of
// (seed, its index in probs), as the dropout op's.
struct AttentionShape {
  std::int64_t batch = 0, tokens = 0, heads = 0, head_size = 0;
  bool causal = true;
  float dropout = 0.0f;
  std::uint64_t seed = 0;
  // The first sequence's place in the whole batch, when a kernel call computes a slice of it: dropout
  // draws each probability's mask from its index in the whole batch, so slices give the whole's mask.
  std::int64_t first_sequence = 0;
};

// body(part, first) for slices of an attention's batch, `per_slice` sequences at a time (at least 1): part
// is the shape of sequences [first, first + part.batch), its first_sequence their place in the whole batch.
// Each sequence's attention is its own and dropout draws by that place, so slicing changes no bit; the
// 16-bit paths slice so that their float32 copies stay a fraction of the batch.
template <class Body>
void for_sequence_slices(const AttentionShape& s, std::int64_t per_slice, Body body) {
  const std::int64_t step = per_slice < 1 ? 1 : per_slice;
  for (std::int64_t first = 0; first < s.batch; first += step) {
    AttentionShape part = s;
    part.batch = step < s.batch - first ? step : s.batch - first;
    part.first_sequence = s.first_sequence + first;
    body(part, first);
  }
}

// One block of ring attention (Liu et al., "Ring Attention with Blockwise Transformers", 2023): a
// rank's queries against one block of keys and values, folded into a running softmax by the online
// rule (Milakov & Gimelshein, 2018; as FlashAttention does, Dao et al. 2022). q, k, v and out are
// [batch, tokens, heads, head_size] (the heads side by side); each query and key carries its position
// in the whole sequence (floats, exact below 2^24), and with `causal` query i sees key j only where
// position(j) <= position(i), so the blocks of a sequence cut any way give the whole causal attention.
struct AttentionBlockShape {
  std::int64_t batch = 0, heads = 0, head_size = 0, queries = 0, keys = 0;
  bool causal = true;
};

// Broadcasting by the full NumPy rule, for the kernels: the output's shape (at most kMaxDims) and each
// operand's element strides along it, 0 where the operand is repeated. common/ops computes them.
constexpr int kMaxDims = 8;
struct BroadcastIndex {
  int rank = 0;
  std::int64_t dims[kMaxDims] = {};
  std::int64_t a_strides[kMaxDims] = {};
  std::int64_t b_strides[kMaxDims] = {};
};

class Kernels {
 public:
  virtual ~Kernels() = default;
  virtual void fill(float* out, std::size_t n, float value) = 0;
  // Every one of n 16-bit values set to `bits` (a 16-bit tensor's fill, the value rounded by the caller).
  virtual void fill_bits(std::uint16_t* out, std::size_t n, std::uint16_t bits) = 0;
  virtual void copy(float* out, const float* in, std::size_t n) = 0;
  // Row-major C[m,n] = alpha * op(A) op(B) + beta * C, with op(X) = X or X^T.
  virtual void gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
                    const float* a, const float* b, float beta, float* c) = 0;
  // `batch` independent GEMMs: matrix i of A, B and C starts i * stride_a, i * stride_b, i * stride_c in.
  virtual void gemm_batched(bool trans_a, bool trans_b, std::int64_t batch, std::int64_t m, std::int64_t n,
                            std::int64_t k, float alpha, const float* a, std::int64_t stride_a, const float* b,
                            std::int64_t stride_b, float beta, float* c, std::int64_t stride_c) = 0;
  // The same two on 16-bit matrices (A, B and C all in `format`): products accumulated in float32 and C
  // rounded once at the end (beta C read from the 16-bit C). cuBLAS runs them as cublasGemmEx with
  // CUBLAS_COMPUTE_32F (tensor cores); the CPU widens the operands to float32, which holds every 16-bit
  // value exactly, and rounds the float32 GEMM's result (cpu::half_gemm_path says why).
  void gemm_half(HalfFormat format, bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                 float alpha, const std::uint16_t* a, const std::uint16_t* b, float beta, std::uint16_t* c) {
    gemm_batched_half(format, trans_a, trans_b, 1, m, n, k, alpha, a, m * k, b, k * n, beta, c, m * n);
  }
  virtual void gemm_batched_half(HalfFormat format, bool trans_a, bool trans_b, std::int64_t batch, std::int64_t m,
                                 std::int64_t n, std::int64_t k, float alpha, const std::uint16_t* a,
                                 std::int64_t stride_a, const std::uint16_t* b, std::int64_t stride_b, float beta,
                                 std::uint16_t* c, std::int64_t stride_c) = 0;
  // out[i] = a[i % a_n] op b[i % b_n] for i < n: same shapes, or one operand repeated (broadcast).
  virtual void binary(BinaryOp op, const float* a, std::size_t a_n, const float* b, std::size_t b_n, float* out,
                      std::size_t n) = 0;
  // The general case: out (shape index.dims, row-major) [i] = a[a offset of i] op b[b offset of i].
  virtual void binary_broadcast(BinaryOp op, const float* a, const float* b, float* out,
                                const BroadcastIndex& index) = 0;
  // A strided copy: out (shape index.dims, row-major) [i] = in[a offset of i] (permutes, transposes).
  virtual void gather(const float* in, float* out, const BroadcastIndex& index) = 0;
  // Its gradient's reduction: `in` has shape index.dims; out[j] (out_n elements, contiguous) is the sum of
  // every in[i] whose a offset is j, added in increasing i, in double (deterministic, the same bits on
  // both devices).
  virtual void sum_to(const float* in, float* out, std::size_t out_n, const BroadcastIndex& index) = 0;
  virtual void scale(const float* in, float factor, float* out, std::size_t n) = 0;
  // float32 to 16 bits (round to nearest even) and back; chapter 05's compression hooks.
  virtual void to_half(HalfFormat format, const float* in, std::uint16_t* out, std::size_t n) = 0;
  virtual void from_half(HalfFormat format, const std::uint16_t* in, float* out, std::size_t n) = 0;
  // Element-wise kernels read and written in 16 bits (every operand in `format`): each value widened
  // exactly, the float32 kernel's formula, the result rounded once to `format`. The bits of from_half,
  // the float32 kernel, then to_half, without the float32 copies (a mixed-precision GELU, residual add
  // or gradient sum moves a third of the bytes). binary_half repeats operands as binary does.
  virtual void binary_half(HalfFormat format, BinaryOp op, const std::uint16_t* a, std::size_t a_n,
                           const std::uint16_t* b, std::size_t b_n, std::uint16_t* out, std::size_t n) = 0;
  virtual void unary_half(HalfFormat format, UnaryOp op, const std::uint16_t* in, std::uint16_t* out,
                          std::size_t n) = 0;
  virtual void unary_backward_half(HalfFormat format, UnaryOp op, const std::uint16_t* in,
                                   const std::uint16_t* grad_out, std::uint16_t* grad_in, std::size_t n) = 0;
  // acc[i] += in[i] widened: a 16-bit gradient added into a float32 one (a float32 leaf's accumulation).
  virtual void add_half(HalfFormat format, const std::uint16_t* in, float* acc, std::size_t n) = 0;
  // Deterministic reductions: a fixed summation order, so repeated runs give identical bits.
  virtual void sum(const float* in, std::size_t n, float* out) = 0;
  virtual void sum_rows(const float* in, std::size_t rows, std::size_t cols, float* out) = 0;  // over rows
  virtual void unary(UnaryOp op, const float* in, float* out, std::size_t n) = 0;
  virtual void unary_backward(UnaryOp op, const float* in, const float* grad_out, float* grad_in,
                              std::size_t n) = 0;
  // Softmax of each row of `cols`. With `causal`, row r is query r % cols of a square score matrix and
  // may not look ahead: columns after it get probability 0 (the GPT's causal mask).
  virtual void softmax(const float* in, std::size_t rows, std::size_t cols, bool causal, float* out) = 0;
  // grad_in = y (grad_out - sum_j grad_out_j y_j), row by row, from the softmax's output y.
  virtual void softmax_backward(const float* y, const float* grad_out, std::size_t rows, std::size_t cols,
                                float* grad_in) = 0;
  // Attention forward: probs [batch, heads, tokens, tokens] gets softmax(q k^T / sqrt(head_size)) (0 where
  // the mask hides a key; with the causal mask a kernel may leave the entries above the diagonal block it
  // works in unwritten: probs is the backward's, nobody else reads it), y [batch, tokens, heads, head_size]
  // the heads' outputs (what c_proj reads).
  virtual void attention(const float* qkv, const AttentionShape& shape, float* probs, float* y) = 0;
  // Its gradient: grad_qkv (overwritten, qkv's layout) from grad_y and the forward's probs.
  virtual void attention_backward(const float* qkv, const float* probs, const float* grad_y,
                                  const AttentionShape& shape, float* grad_qkv) = 0;
  // FlashAttention-2 (Dao, 2023; kernels/flash.h): y as attention's, and lse [batch, heads, tokens], each
  // query row's log-sum-exp, in place of the probabilities; nothing tokens x tokens is stored. Head sizes
  // up to math::kFlashMaxHeadSize. The CPU's is the model of the GPU's tiles, the same bits.
  virtual void flash_attention(const float* qkv, const AttentionShape& shape, float* lse, float* y) = 0;
  // Its gradient: grad_qkv (overwritten, qkv's layout) from y, lse and grad_y, the probabilities computed
  // again; deterministic (dQ in a pass of its own, no atomics).
  virtual void flash_attention_backward(const float* qkv, const float* y, const float* lse, const float* grad_y,
                                        const AttentionShape& shape, float* grad_qkv) = 0;
  // The same two on 16-bit tensors in `format` (qkv, y, grad_y and grad_qkv; lse stays float32), read and
  // written where they lie: the float32 kernels' bits on the widened values, each output rounded once. The
  // GPU widens each value as its tile is staged; the CPU widens a slice of sequences at a time.
  virtual void flash_attention_half(HalfFormat format, const std::uint16_t* qkv, const AttentionShape& shape,
                                    float* lse, std::uint16_t* y) = 0;
  virtual void flash_attention_backward_half(HalfFormat format, const std::uint16_t* qkv, const std::uint16_t* y,
                                             const float* lse, const std::uint16_t* grad_y,
                                             const AttentionShape& shape, std::uint16_t* grad_qkv) = 0;
  // Ring attention's block (AttentionBlockShape): row_max and row_sum [batch, heads, queries] (start at
  // -inf and 0) and out (starts at 0) are the running maximum score, the running sum of exp(score - max)
  // and the running sum of those weights times v; each call takes one more block of keys in.
  virtual void attention_block(const float* q, const float* k, const float* v, const float* q_pos, const float* k_pos,
                               const AttentionBlockShape& shape, float* row_max, float* row_sum, float* out) = 0;
  // After the last block: out /= row_sum, and lse = row_max + log(row_sum), the log of each row's
  // softmax denominator, which is all backward keeps of the probabilities.
  virtual void attention_block_finish(const float* row_max, const float* row_sum, const AttentionBlockShape& shape,
                                      float* out, float* lse) = 0;
  // The block's share of the gradient, added to grad_q, grad_k and grad_v (q's, k's and v's layouts):
  // the probabilities again from lse, and the softmax's gradient from the final out and grad_out
  // (FlashAttention's backward: ds = p (dp - rowsum(grad_out * out))).
  virtual void attention_block_backward(const float* q, const float* k, const float* v, const float* q_pos,
                                        const float* k_pos, const float* out, const float* lse, const float* grad_out,
                                        const AttentionBlockShape& shape, float* grad_q, float* grad_k,
                                        float* grad_v) = 0;
  // Per-row softmax cross-entropy; targets hold class indices as floats, and a negative target marks
  // a row to ignore (loss 0, gradient 0).
  virtual void cross_entropy(const float* logits, const float* targets, std::size_t rows, std::size_t cols,
                             float* losses) = 0;
  virtual void cross_entropy_backward(const float* logits, const float* targets, const float* grad_losses,
                                      std::size_t rows, std::size_t cols, float* grad_logits) = 0;
  // The same on 16-bit logits read where they lie (GPT-2's classifier under autocast; llm.c's fused
  // classifier): the float32 kernels' arithmetic on their exact widening, so the same losses. Forward
  // keeps each row's largest logit and sum of exp (`top`, `total`: rows each), so backward reads the
  // logits once instead of three times, and writes the gradient in 16 bits, rounded once as the float32
  // gradient's cast would round it. No float32 copy of the logits or of their gradient.
  virtual void cross_entropy_half(HalfFormat format, const std::uint16_t* logits, const float* targets,
                                  std::size_t rows, std::size_t cols, float* losses, float* top, double* total) = 0;
  virtual void cross_entropy_backward_half(HalfFormat format, const std::uint16_t* logits, const float* targets,
                                           const float* grad_losses, const float* top, const double* total,
                                           std::size_t rows, std::size_t cols, std::uint16_t* grad_logits) = 0;
  // Layer normalisation over each row of `cols` (Ba et al., 2016), as nn.LayerNorm: the biased variance,
  // eps inside the square root. Forward keeps each row's mean and 1/sqrt(var + eps) for backward.
  virtual void layer_norm(const float* x, const float* weight, const float* bias, std::size_t rows, std::size_t cols,
                          float eps, float* out, float* mean, float* rstd) = 0;
  // dx, and the weight's and bias's gradients summed over rows (overwritten, rows in order).
  virtual void layer_norm_backward(const float* x, const float* weight, const float* mean, const float* rstd,
                                   const float* grad_out, std::size_t rows, std::size_t cols, float* grad_x,
                                   float* grad_weight, float* grad_bias) = 0;
  // Embedding lookup: out row i = weight row ids[i] (ids are indices stored as floats, checked by
  // check_indices first; a GPU, which raises a bad one later, writes zeros for it and reads nothing).
  virtual void embedding(const float* ids, const float* weight, std::size_t n, std::size_t dim, std::size_t vocab,
                         float* out) = 0;
  // Its gradient, a scatter-add: grad_weight (vocab x dim, overwritten) row v = sum of grad_out rows i
  // with ids[i] = v, added in increasing i on both devices (deterministic, no atomics).
  virtual void embedding_backward(const float* ids, const float* grad_out, std::size_t n, std::size_t dim,
                                  std::size_t vocab, float* grad_weight) = 0;
  // out[i] = i, exact below 2^24: the GPT's position ids, made where they are used.
  virtual void arange(float* out, std::size_t n) = 0;
  // nn.Dropout's product: out[i] = in[i] times 0 (with probability p) or 1 / (1 - p), drawn from
  // (seed, first + i) by math::dropout_keep, so every device, and any split of the work, draws the same mask.
  virtual void dropout(const float* in, float* out, std::size_t n, float p, std::uint64_t seed,
                       std::uint64_t first) = 0;
  // Clipping's norm: adds the squares of in[0..n), in double, to *total (one double where the gradients
  // are), in the GPU's tiled order on both devices (squares_tiled below), so both give the same bits; then
  // from the total, norm = sqrt(total) rounded to float32 and factor = math::clip_coefficient(norm,
  // max_norm), both written where the gradients are.
  virtual void add_squares(const float* in, std::size_t n, double* total) = 0;
  virtual void clip_coefficient(const double* total, double max_norm, float* norm, float* factor) = 0;
  // out[i] = in[i] * *factor, the factor read where it lies: a device's own scalar scales without the host.
  virtual void scale_by(const float* in, const float* factor, float* out, std::size_t n) = 0;
  // The indices an op is about to use, checked where they are (IndexCheck, common/core/index_check.h): each
  // of ids[0..n) must be a whole number in [0, limit), or ignore_index (NaN: none). The CPU throws at once
  // (std::invalid_argument); a GPU records the first bad index found, and the host raises it at its next
  // read of a tensor (the loss it reads anyway), so that checking costs no wait.
  virtual void check_indices(IndexCheck check, const float* ids, std::size_t n, std::size_t limit,
                             float ignore_index) = 0;
  // *inverse = 1 / (the number of targets other than ignore_index): the mean's divisor of a cross-entropy,
  // without the host counting; none counted is IndexCheck::every_target_ignored.
  virtual void inverse_count(const float* targets, std::size_t n, float ignore_index, float* inverse) = 0;
  // momentum_buffer may be null when momentum is 0.
  virtual void sgd_step(float* param, const float* grad, float* momentum_buffer, std::size_t n,
                        const SgdParams& p) = 0;
  // Adam over every tensor of the list: on a GPU one launch for up to kMultiTensorLaunch tensors
  // (kernels/multi_tensor.h), instead of one a tensor.
  virtual void adam_step(const std::vector<AdamTensor>& tensors, const AdamParams& p) = 0;
};

Kernels& kernels(Device device);

// While one of these is alive on this thread, kernels(Device::cpu) runs no 16-bit kernel: each is
// replaced by its definition above, the operands widened (from_half), the float32 kernel, the result
// rounded once (to_half), in code of its own (cpu_emulated_half.cpp). A reference that computes a
// 16-bit model under it shares no 16-bit kernel with the run it checks, so a 16-bit kernel that rounds
// wrongly or reads the wrong row differs from it (chapter 07's --verify; verify/lockstep.h). On the CPU
// the two give the same bits by definition; the faults that stand for such bugs (ops/kernel_faults.h)
// are not in it. CPU only: a GPU's 16-bit GEMMs add in another order than its float32 ones.
class EmulatedHalfKernels {
 public:
  EmulatedHalfKernels();
  ~EmulatedHalfKernels();
  EmulatedHalfKernels(const EmulatedHalfKernels&) = delete;
  EmulatedHalfKernels& operator=(const EmulatedHalfKernels&) = delete;
  static bool active();  // on this thread

 private:
  bool previous_;
};

// The sum of squares as the CUDA kernel tiles it, the one order of add_squares on both devices: kSquaresBlocks
// blocks of kSquaresThreads threads; thread t of block b adds, in double, the squares of elements
// b * kSquaresThreads + t, then every kSquaresBlocks * kSquaresThreads further, in order; each block folds
// its threads' sums by halving strides (s[t] += s[t + stride], stride = threads / 2, ..., 1); the blocks'
// sums are added to `total` in block order. Returns the new total.
constexpr int kSquaresBlocks = 128, kSquaresThreads = 256;
double squares_tiled(const float* in, std::size_t n, double total);
// torch.backends.cuda.matmul.allow_tf32: the CUDA backend's float32 matrix products on tensor cores in
// TF32 (float32's range, a 10-bit mantissa: unit roundoff 2^-11 on the inputs, products accumulated in
// float32). Off by default, so GPU results stay comparable with the CPU reference; the CPU has no TF32.
void set_allow_tf32(bool allow);
bool allow_tf32();
// Limits the CPU kernels (OpenBLAS's GEMM and the element-wise loops) to `threads` threads; ranks
// sharing a machine must not oversubscribe it. `gemm_threads`, when positive, gives OpenBLAS another
// count: the course's own kernels give the same bits at any thread count, OpenBLAS's GEMM only on some
// of its kernels (with OPENBLAS_CORETYPE=Haswell a 256^3 sgemm differs between 1 and 2 threads), so a
// test of the former holds the latter still.
void set_cpu_threads(int threads, int gemm_threads = 0);
int cpu_threads();

}  // namespace course
