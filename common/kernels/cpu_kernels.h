// The CPU backend's kernels, declared here once and defined by op family beside the ops' shared formulas
// (math.h, rows.h, flash.h): cpu_elementwise.cpp, cpu_reductions.cpp, cpu_layer_norm.cpp,
// cpu_cross_entropy.cpp, cpu_softmax.cpp, cpu_embedding.cpp, cpu_optim.cpp, the GEMMs in cpu_gemm.cpp,
// attention in cpu_attention.cpp, cpu_flash_attention.cpp and cpu_attention_block.cpp, and the rest
// (fills, copies, dropout, the index checks) with the dispatch in cpu_kernels.cpp. Internal to the CPU
// backend: the rest of the library reaches these through kernels(Device::cpu) (kernels.h). The loops
// the families share are here too.
#pragma once
#include <algorithm>
#include <cstdint>
#include <functional>
#include <vector>

#include "common/kernels/half.h"
#include "common/kernels/kernels.h"
#include "common/kernels/math.h"
#include "common/kernels/parallel.h"

namespace course {
namespace cpu_loops {

// Walks the elements of shape index.dims in row-major order, calling visit(i, a offset, b offset). The
// innermost dimension is a plain loop (what the compiler vectorises for contiguous runs); the outer
// offsets move by their strides, and when a dimension rolls over, step back by what it advanced.
// Runs of the innermost dimension are shared among the threads; each starts from its first run's index.
template <class Visit>
inline void for_each_offset(const BroadcastIndex& ix, Visit visit) {
  if (ix.rank == 0) {
    visit(0, 0, 0);
    return;
  }
  const int last = ix.rank - 1;
  const std::int64_t inner = ix.dims[last], as = ix.a_strides[last], bs = ix.b_strides[last];
  std::int64_t runs = 1;
  for (int d = 0; d < last; ++d) runs *= ix.dims[d];
  if (inner == 0 || runs == 0) return;
  parallel_for(static_cast<std::size_t>(runs), static_cast<std::size_t>(inner), [&](std::size_t first, std::size_t end) {
    std::int64_t idx[kMaxDims] = {}, ao = 0, bo = 0;
    auto rest = static_cast<std::int64_t>(first);
    for (int d = last - 1; d >= 0; --d) {  // the multi-index of run `first`
      idx[d] = rest % ix.dims[d];
      rest /= ix.dims[d];
      ao += idx[d] * ix.a_strides[d];
      bo += idx[d] * ix.b_strides[d];
    }
    for (auto run = static_cast<std::int64_t>(first); run < static_cast<std::int64_t>(end); ++run) {
      const std::int64_t i = run * inner;
      for (std::int64_t j = 0; j < inner; ++j) visit(i + j, ao + j * as, bo + j * bs);
      for (int d = last - 1; d >= 0; --d) {
        if (++idx[d] < ix.dims[d]) {
          ao += ix.a_strides[d];
          bo += ix.b_strides[d];
          break;
        }
        ao -= ix.a_strides[d] * (ix.dims[d] - 1);
        bo -= ix.b_strides[d] * (ix.dims[d] - 1);
        idx[d] = 0;
      }
    }
  });
}

// The same walk on one thread, for reductions whose order must not depend on the thread count.
template <class Visit>
inline void for_each_offset_serial(const BroadcastIndex& ix, Visit visit) {
  std::int64_t n = 1;
  for (int d = 0; d < ix.rank; ++d) n *= ix.dims[d];
  std::int64_t idx[kMaxDims] = {}, ao = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    visit(i, ao);
    for (int d = ix.rank - 1; d >= 0; --d) {
      if (++idx[d] < ix.dims[d]) {
        ao += ix.a_strides[d];
        break;
      }
      ao -= ix.a_strides[d] * (ix.dims[d] - 1);
      idx[d] = 0;
    }
  }
}

// An element-wise loop over [0, n), shared among the threads.
template <class Body>
inline void elementwise(std::size_t n, Body body) {
  parallel_for(n, 1, [&](std::size_t begin, std::size_t end) {
    for (std::size_t i = begin; i < end; ++i) body(i);
  });
}

// Calls body(f) with f the scalar function of `op`, a compile-time constant inside the loops it runs,
// so they vectorise (a switch per element would not).
template <class Body>
inline void with_binary_op(BinaryOp op, Body body) {
  switch (op) {
    case BinaryOp::add: return body([](float x, float y) { return math::binary(BinaryOp::add, x, y); });
    case BinaryOp::sub: return body([](float x, float y) { return math::binary(BinaryOp::sub, x, y); });
    case BinaryOp::mul: return body([](float x, float y) { return math::binary(BinaryOp::mul, x, y); });
    case BinaryOp::max: return body([](float x, float y) { return math::binary(BinaryOp::max, x, y); });
  }
}

// Columns [first, end) of a two-stage column sum (math::column_chunks): each chunk's sums read row by row
// (contiguous), then added to the columns' totals in chunk order, as the GPU's two stages add them.
template <class Chunk>
inline void column_sums(std::size_t rows, std::size_t first, std::size_t end, int outputs, Chunk chunk_sums,
                 const std::function<void(int, std::size_t, float)>& write) {
  const std::size_t n = end - first;
  std::vector<double> total(static_cast<std::size_t>(outputs) * n, 0.0), chunk(total.size());
  for (std::size_t k = 0; k < math::column_chunks(rows); ++k) {
    std::fill(chunk.begin(), chunk.end(), 0.0);
    const std::size_t last = std::min(rows, (k + 1) * math::kColumnChunk);
    for (std::size_t r = k * math::kColumnChunk; r < last; ++r) chunk_sums(r, chunk.data());
    for (std::size_t i = 0; i < total.size(); ++i) total[i] = rn::add(total[i], chunk[i]);
  }
  for (int o = 0; o < outputs; ++o)
    for (std::size_t c = 0; c < n; ++c) write(o, first + c, static_cast<float>(total[static_cast<std::size_t>(o) * n + c]));
}

// n 16-bit values widened exactly into floats, and floats rounded once into 16 bits: the format a
// constant of the loop, so that it vectorises. from_half, to_half and every 16-bit kernel's blocks.
inline void widen_into(HalfFormat format, const std::uint16_t* in, float* out, std::size_t n) {
  half::with_format(format, [&](auto f) {
    for (std::size_t i = 0; i < n; ++i) out[i] = half::widen<decltype(f)::value>(in[i]);
  });
}

inline void narrow_into(HalfFormat format, const float* in, std::uint16_t* out, std::size_t n) {
  half::with_format(format, [&](auto f) {
    for (std::size_t i = 0; i < n; ++i) out[i] = half::narrow<decltype(f)::value>(in[i]);
  });
}

// Rows [first, end) of 16-bit logits through `body(r, widened row, float scratch)`, a row at a time.
template <class Body>
inline void for_each_widened_row(HalfFormat format, const std::uint16_t* logits, std::size_t first, std::size_t end,
                          std::size_t cols, Body body) {
  std::vector<float> row(cols), scratch(cols);
  for (std::size_t r = first; r < end; ++r) {
    widen_into(format, logits + r * cols, row.data(), cols);
    body(r, row.data(), scratch.data());
  }
}

// n 16-bit values widened into a new float vector.
inline std::vector<float> widened(HalfFormat format, const std::uint16_t* in, std::int64_t n) {
  std::vector<float> out(static_cast<std::size_t>(n));
  parallel_for(out.size(), 1, [&](std::size_t b, std::size_t e) { widen_into(format, in + b, out.data() + b, e - b); });
  return out;
}

// A 16-bit element-wise kernel as its float32 loop on blocks: each thread takes kHalfBlock elements at a
// time, `body(first, count, results)` widens its operands' values for [first, first + count) and runs the
// float32 loop into `results`, which are rounded into out once. Blocks change no arithmetic.
constexpr std::size_t kHalfBlock = 1024;

template <class Body>
inline void in_half_blocks(HalfFormat format, std::uint16_t* out, std::size_t n, Body body) {
  parallel_for(n, 1, [&](std::size_t begin, std::size_t end) {
    float results[kHalfBlock];
    for (std::size_t first = begin; first < end; first += kHalfBlock) {
      const std::size_t count = std::min(kHalfBlock, end - first);
      body(first, count, results);
      narrow_into(format, results, out + first, count);
    }
  });
}

// Values [first, first + count) of a 16-bit operand of `size` elements repeated along the output (as
// Kernels::binary repeats it), widened into `out`.
inline void widen_repeated(HalfFormat format, const std::uint16_t* in, std::size_t size, std::size_t first, std::size_t count,
                    float* out) {
  for (std::size_t done = 0; done < count;) {  // runs of the operand that do not wrap round
    const std::size_t at = (first + done) % size, run = std::min(count - done, size - at);
    widen_into(format, in + at, out + done, run);
    done += run;
  }
}

}  // namespace cpu_loops

class CpuKernels : public Kernels {  // cpu_emulated_half.cpp derives from it
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
  void to_half(HalfFormat format, const float* in, std::uint16_t* out, std::size_t n) override;
  void from_half(HalfFormat format, const std::uint16_t* in, float* out, std::size_t n) override;
  void binary_half(HalfFormat format, BinaryOp op, const std::uint16_t* a, std::size_t an, const std::uint16_t* b,
                   std::size_t bn, std::uint16_t* out, std::size_t n) override;
  void unary_half(HalfFormat format, UnaryOp op, const std::uint16_t* in, std::uint16_t* out, std::size_t n) override;
  void unary_backward_half(HalfFormat format, UnaryOp op, const std::uint16_t* in, const std::uint16_t* g,
                           std::uint16_t* out, std::size_t n) override;
  void add_half(HalfFormat format, const std::uint16_t* in, float* acc, std::size_t n) override;
  void scale(const float* in, float factor, float* out, std::size_t n) override;
  void sum(const float* in, std::size_t n, float* out) override;
  void sum_rows(const float* in, std::size_t rows, std::size_t cols, float* out) override;
  void unary(UnaryOp op, const float* in, float* out, std::size_t n) override;
  void unary_backward(UnaryOp op, const float* in, const float* g, float* out, std::size_t n) override;
  void layer_norm(const float* x, const float* w, const float* b, std::size_t rows, std::size_t cols, float eps,
                  float* out, float* mean, float* rstd) override;
  void layer_norm_backward(const float* x, const float* w, const float* mean, const float* rstd, const float* g,
                           std::size_t rows, std::size_t cols, float* dx, float* dw, float* db) override;
  void embedding(const float* ids, const float* weight, std::size_t n, std::size_t dim, std::size_t, float* out) override;
  void embedding_backward(const float* ids, const float* g, std::size_t n, std::size_t dim, std::size_t vocab,
                          float* dw) override;
  void softmax(const float* in, std::size_t rows, std::size_t cols, bool causal, float* out) override;
  void softmax_backward(const float* y, const float* g, std::size_t rows, std::size_t cols, float* dx) override;
  void attention(const float* qkv, const AttentionShape& shape, float* probs, float* y) override;
  void attention_backward(const float* qkv, const float* probs, const float* grad_y, const AttentionShape& shape,
                          float* grad_qkv) override;
  void flash_attention(const float* qkv, const AttentionShape& shape, float* lse, float* y) override;
  void flash_attention_backward(const float* qkv, const float* y, const float* lse, const float* grad_y,
                                const AttentionShape& shape, float* grad_qkv) override;
  void flash_attention_half(HalfFormat format, const std::uint16_t* qkv, const AttentionShape& s, float* lse,
                            std::uint16_t* y) override;
  void flash_attention_backward_half(HalfFormat format, const std::uint16_t* qkv, const std::uint16_t* y,
                                     const float* lse, const std::uint16_t* grad_y, const AttentionShape& s,
                                     std::uint16_t* grad_qkv) override;
  void attention_block(const float* q, const float* k, const float* v, const float* q_pos, const float* k_pos,
                       const AttentionBlockShape& shape, float* row_max, float* row_sum, float* out) override;
  void attention_block_finish(const float* row_max, const float* row_sum, const AttentionBlockShape& shape, float* out,
                              float* lse) override;
  void attention_block_backward(const float* q, const float* k, const float* v, const float* q_pos, const float* k_pos,
                                const float* out, const float* lse, const float* grad_out, const AttentionBlockShape& shape,
                                float* grad_q, float* grad_k, float* grad_v) override;
  void cross_entropy(const float* logits, const float* targets, std::size_t rows, std::size_t cols,
                     float* losses) override;
  void cross_entropy_backward(const float* logits, const float* targets, const float* g, std::size_t rows,
                              std::size_t cols, float* out) override;
  void cross_entropy_half(HalfFormat format, const std::uint16_t* logits, const float* targets, std::size_t rows,
                          std::size_t cols, float* losses, float* top, double* total) override;
  void cross_entropy_backward_half(HalfFormat format, const std::uint16_t* logits, const float* targets,
                                   const float* g, const float* top, const double* total, std::size_t rows,
                                   std::size_t cols, std::uint16_t* out) override;
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
