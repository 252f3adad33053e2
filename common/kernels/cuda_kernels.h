// The CUDA backend's kernels, declared here once and defined by op family beside the ops' shared formulas
// (math.h, rows.h, flash.h): cuda_elementwise.cu, cuda_reductions.cu, cuda_layer_norm.cu,
// cuda_cross_entropy.cu, cuda_softmax.cu, cuda_embedding.cu, cuda_optim.cu, cuda_gemm.cu,
// cuda_attention.cu, cuda_attention_block.cu (FlashAttention's own kernels in cuda_flash_attention.cu),
// and the rest (fills, dropout, the index checks) in cuda_kernels.cu. Each mirrors its CPU family
// (cpu_kernels.h), and the parity tests hold the two together. Reductions use a fixed thread-to-data
// mapping and a fixed tree, never atomics: the same inputs give the same bits on every run. Internal to
// the CUDA backend (.cu files only); the launch helpers the families share are here too.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <utility>
#include <vector>

#include "common/core/cuda_check.h"
#include "common/core/cuda_runtime.h"
#include "common/core/index_check.h"
#include "common/kernels/kernels.h"
#include "common/kernels/math.h"
#include "common/kernels/rows.h"

namespace course {
namespace cuda_launch {

constexpr int kThreads = 256;
constexpr int kReduceThreads = 1024;

inline unsigned blocks_for(std::size_t n, int threads = kThreads) {
  std::size_t blocks = (n + threads - 1) / threads;
  return static_cast<unsigned>(blocks < 65535 ? (blocks == 0 ? 1 : blocks) : 65535);  // grid-stride covers the rest
}

// A two-stage column sum's first grid: blocks of columns along x, chunks of rows along y (each capped;
// the kernels stride over the rest).
inline dim3 column_grid(std::size_t cols, std::size_t chunks) {
  return dim3(blocks_for(cols), static_cast<unsigned>(chunks < 65535 ? chunks : 65535));
}

inline void check_launch() { COURSE_CUDA_CHECK(cudaGetLastError()); }

// Scratch device memory for one call, from the caching pool (kernels on the stream run in order, so a
// block released here is reused only by work queued after this call's).
class DeviceBuffer {
 public:
  explicit DeviceBuffer(std::size_t n) : n_(n), p_(n ? static_cast<float*>(cuda::allocate(n * sizeof(float))) : nullptr) {}
  ~DeviceBuffer() {
    if (p_) cuda::release(p_, n_ * sizeof(float));
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  float* get() const { return p_; }

 private:
  std::size_t n_;
  float* p_;
};

// A strided copy's index: the output's dimensions, each with its stride in the input.
inline BroadcastIndex strided(std::initializer_list<std::pair<std::int64_t, std::int64_t>> dims) {
  BroadcastIndex ix;
  for (const auto& [size, stride] : dims) {
    ix.dims[ix.rank] = size;
    ix.a_strides[ix.rank++] = stride;
  }
  return ix;
}

// The attention's layouts: the packed projection [B, T, 3, H, hs], the heads apart [3, B, H, T, hs] (each
// head's matrices contiguous, for strided-batched GEMMs), the output [B, T, H, hs].
inline BroadcastIndex packed_to_heads(const AttentionShape& s) {
  const std::int64_t c = s.heads * s.head_size;
  return strided({{3, c}, {s.batch, s.tokens * 3 * c}, {s.heads, s.head_size}, {s.tokens, 3 * c}, {s.head_size, 1}});
}

inline BroadcastIndex heads_to_packed(const AttentionShape& s) {
  const std::int64_t n = s.batch * s.heads * s.tokens * s.head_size;
  return strided({{s.batch, s.heads * s.tokens * s.head_size}, {s.tokens, s.head_size}, {3, n},
                  {s.heads, s.tokens * s.head_size}, {s.head_size, 1}});
}

inline BroadcastIndex heads_to_tokens(const AttentionShape& s) {
  return strided({{s.batch, s.heads * s.tokens * s.head_size}, {s.tokens, s.head_size},
                  {s.heads, s.tokens * s.head_size}, {s.head_size, 1}});
}

inline BroadcastIndex tokens_to_heads(const AttentionShape& s) {
  const std::int64_t c = s.heads * s.head_size;
  return strided({{s.batch, s.tokens * c}, {s.heads, s.head_size}, {s.tokens, c}, {s.head_size, 1}});
}

// A row's lanes on the GPU (rows.h): kLanes neighbouring threads of a warp, one lane each, folded with
// shuffles in lane order, so a row's sums are the CPU's additions, one by one. A warp takes four rows.
struct GroupLanes {
  unsigned lane, mask;  // this thread's lane; its group's threads in the warp
  template <class Term>
  __device__ double sum(std::size_t n, Term term) const {
    const float mine = math::lane_partial(n, lane, term);
    float acc[math::kLanes];
    for (unsigned l = 0; l < math::kLanes; ++l) acc[l] = __shfl_sync(mask, mine, static_cast<int>(l), math::kLanes);
    return math::lane_fold(acc);
  }
  template <class Row>
  __device__ float max(const Row& x, std::size_t n) const {
    const float mine = math::lane_max_partial(x, n, lane);
    float acc[math::kLanes];
    for (unsigned l = 0; l < math::kLanes; ++l) acc[l] = __shfl_sync(mask, mine, static_cast<int>(l), math::kLanes);
    return math::lane_max_fold(acc);
  }
  __device__ std::size_t first() const { return lane; }
  __device__ static constexpr std::size_t stride() { return math::kLanes; }
};

// Calls row(lanes, r) for every row r, a group of kLanes threads to a row (grid-stride: every thread of a
// group takes the same rows, so a group's shuffles always find all its threads).
template <class Row>
__device__ void for_each_row_in_lanes(std::size_t rows, Row row) {
  const std::size_t thread = blockIdx.x * blockDim.x + threadIdx.x, groups = gridDim.x * blockDim.x / math::kLanes;
  const auto lane = static_cast<unsigned>(threadIdx.x % math::kLanes);
  const GroupLanes lanes{lane, 0xFFu << (threadIdx.x % 32 - lane)};
  for (std::size_t r = thread / math::kLanes; r < rows; r += groups) row(lanes, r);
}

// The first failed check is kept (a later one finds the record taken); the record is in mapped host memory.
__device__ inline void record_failed_check(IndexCheckRecord* record, IndexCheck check, float value, std::size_t limit) {
  volatile IndexCheckRecord* r = record;
  if (r->check != static_cast<int>(IndexCheck::none)) return;
  r->value = value;
  r->limit = limit;
  __threadfence_system();
  r->check = static_cast<int>(check);
}

}  // namespace cuda_launch

class CudaKernels final : public Kernels {
  // out = p times the dropout mask of attention's probabilities (0, or 1/(1 - p) where kept), drawn on the
  // device from (seed, index in the whole batch's probabilities) as the CPU draws it; returns out
  // (cuda_attention.cu).
  float* apply_dropout_mask(const float* p, const AttentionShape& s, float* out);
  // A two-stage column sum's second stage: each column's chunk sums added in chunk order, in double
  // (cuda_reductions.cu; sum_rows' and layer norm's).
  void column_totals(const double* partial, std::size_t chunks, std::size_t cols, float* out);
  IndexCheckRecord* check_record() { return static_cast<IndexCheckRecord*>(cuda::index_check_record_device()); }

 public:
  void fill(float* out, std::size_t n, float value) override;
  void fill_bits(std::uint16_t* out, std::size_t n, std::uint16_t bits) override;
  void copy(float* out, const float* in, std::size_t n) override;
  void gemm(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const float* a,
            const float* b, float beta, float* c) override;
  void gemm_batched(bool ta, bool tb, std::int64_t batch, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
                    const float* a, std::int64_t sa, const float* b, std::int64_t sb, float beta, float* c,
                    std::int64_t sc) override;
  void gemm_batched_half(HalfFormat format, bool ta, bool tb, std::int64_t batch, std::int64_t m, std::int64_t n,
                         std::int64_t k, float alpha, const std::uint16_t* a, std::int64_t sa, const std::uint16_t* b,
                         std::int64_t sb, float beta, std::uint16_t* c, std::int64_t sc) override;
  void binary(BinaryOp op, const float* a, std::size_t an, const float* b, std::size_t bn, float* out,
              std::size_t n) override;
  void binary_broadcast(BinaryOp op, const float* a, const float* b, float* out, const BroadcastIndex& ix) override;
  void gather(const float* in, float* out, const BroadcastIndex& ix) override;
  void sum_to(const float* in, float* out, std::size_t out_n, const BroadcastIndex& ix) override;
  void scale(const float* in, float factor, float* out, std::size_t n) override;
  void to_half(HalfFormat format, const float* in, std::uint16_t* out, std::size_t n) override;
  void from_half(HalfFormat format, const std::uint16_t* in, float* out, std::size_t n) override;
  void binary_half(HalfFormat format, BinaryOp op, const std::uint16_t* a, std::size_t an, const std::uint16_t* b,
                   std::size_t bn, std::uint16_t* out, std::size_t n) override;
  void unary_half(HalfFormat format, UnaryOp op, const std::uint16_t* in, std::uint16_t* out, std::size_t n) override;
  void unary_backward_half(HalfFormat format, UnaryOp op, const std::uint16_t* in, const std::uint16_t* g,
                           std::uint16_t* out, std::size_t n) override;
  void add_half(HalfFormat format, const std::uint16_t* in, float* acc, std::size_t n) override;
  void sum(const float* in, std::size_t n, float* out) override;
  void sum_rows(const float* in, std::size_t rows, std::size_t cols, float* out) override;
  void unary(UnaryOp op, const float* in, float* out, std::size_t n) override;
  void unary_backward(UnaryOp op, const float* in, const float* g, float* out, std::size_t n) override;
  void softmax(const float* in, std::size_t rows, std::size_t cols, bool causal, float* out) override;
  void softmax_backward(const float* y, const float* g, std::size_t rows, std::size_t cols, float* dx) override;
  void attention(const float* qkv, const AttentionShape& s, float* probs, float* y) override;
  void flash_attention(const float* qkv, const AttentionShape& s, float* lse, float* y) override;
  void flash_attention_backward(const float* qkv, const float* y, const float* lse, const float* grad_y,
                                const AttentionShape& s, float* grad_qkv) override;
  void flash_attention_half(HalfFormat format, const std::uint16_t* qkv, const AttentionShape& s, float* lse,
                            std::uint16_t* y) override;
  void flash_attention_backward_half(HalfFormat format, const std::uint16_t* qkv, const std::uint16_t* y,
                                     const float* lse, const std::uint16_t* grad_y, const AttentionShape& s,
                                     std::uint16_t* grad_qkv) override;
  void attention_block(const float* q, const float* k, const float* v, const float* q_pos, const float* k_pos,
                       const AttentionBlockShape& s, float* row_max, float* row_sum, float* out) override;
  void attention_block_finish(const float* row_max, const float* row_sum, const AttentionBlockShape& s, float* out,
                              float* lse) override;
  void attention_block_backward(const float* q, const float* k, const float* v, const float* q_pos, const float* k_pos,
                                const float* out, const float* lse, const float* grad_out, const AttentionBlockShape& s,
                                float* grad_q, float* grad_k, float* grad_v) override;
  void attention_backward(const float* qkv, const float* probs, const float* grad_y, const AttentionShape& s,
                          float* grad_qkv) override;
  void layer_norm(const float* x, const float* w, const float* b, std::size_t rows, std::size_t cols, float eps,
                  float* out, float* mean, float* rstd) override;
  void layer_norm_backward(const float* x, const float* w, const float* mean, const float* rstd, const float* g,
                           std::size_t rows, std::size_t cols, float* dx, float* dw, float* db) override;
  void embedding(const float* ids, const float* weight, std::size_t n, std::size_t dim, std::size_t vocab,
                 float* out) override;
  void embedding_backward(const float* ids, const float* g, std::size_t n, std::size_t dim, std::size_t vocab,
                          float* dw) override;
  void cross_entropy(const float* logits, const float* targets, std::size_t rows, std::size_t cols,
                     float* losses) override;
  void cross_entropy_backward(const float* logits, const float* targets, const float* g, std::size_t rows,
                              std::size_t cols, float* out) override;
  void cross_entropy_half(HalfFormat format, const std::uint16_t* logits, const float* targets, std::size_t rows,
                          std::size_t cols, float* losses, float* top, double* total) override;
  void cross_entropy_backward_half(HalfFormat format, const std::uint16_t* logits, const float* targets, const float* g,
                                   const float* top, const double* total, std::size_t rows, std::size_t cols,
                                   std::uint16_t* out) override;
  void arange(float* out, std::size_t n) override;
  void dropout(const float* in, float* out, std::size_t n, float p, std::uint64_t seed, std::uint64_t first) override;
  void add_squares(const float* in, std::size_t n, double* total) override;
  void clip_coefficient(const double* total, double max_norm, float* norm, float* factor) override;
  void scale_by(const float* in, const float* factor, float* out, std::size_t n) override;
  void check_indices(IndexCheck check, const float* ids, std::size_t n, std::size_t limit, float ignore_index) override;
  void inverse_count(const float* targets, std::size_t n, float ignore_index, float* inverse) override;
  void sgd_step(float* p, const float* g, float* buf, std::size_t n, const SgdParams& s) override;
  void adam_step(const std::vector<AdamTensor>& list, const AdamParams& a) override;
};

}  // namespace course
