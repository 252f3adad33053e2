// CPU kernels: the reference implementation of every op. GEMM goes to oneDNN or OpenBLAS (cpu_gemm.h).
#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <functional>
#include <stdexcept>
#include <vector>

#include "common/kernels/cpu_attention.h"
#include "common/kernels/cpu_attention_block.h"
#include "common/kernels/cpu_flash_attention.h"
#include "common/kernels/cpu_gemm.h"
#include "common/kernels/cpu_vector.h"
#include "common/kernels/half.h"
#include "common/kernels/kernels.h"
#include "common/kernels/math.h"
#include "common/kernels/multi_tensor.h"
#include "common/kernels/parallel.h"

namespace course {
namespace {

// Walks the elements of shape index.dims in row-major order, calling visit(i, a offset, b offset). The
// innermost dimension is a plain loop (what the compiler vectorises for contiguous runs); the outer
// offsets move by their strides, and when a dimension rolls over, step back by what it advanced.
// Runs of the innermost dimension are shared among the threads; each starts from its first run's index.
template <class Visit>
void for_each_offset(const BroadcastIndex& ix, Visit visit) {
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
void for_each_offset_serial(const BroadcastIndex& ix, Visit visit) {
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
void elementwise(std::size_t n, Body body) {
  parallel_for(n, 1, [&](std::size_t begin, std::size_t end) {
    for (std::size_t i = begin; i < end; ++i) body(i);
  });
}

// Calls body(f) with f the scalar function of `op`, a compile-time constant inside the loops it runs,
// so they vectorise (a switch per element would not).
template <class Body>
void with_binary_op(BinaryOp op, Body body) {
  switch (op) {
    case BinaryOp::add: return body([](float x, float y) { return math::binary(BinaryOp::add, x, y); });
    case BinaryOp::sub: return body([](float x, float y) { return math::binary(BinaryOp::sub, x, y); });
    case BinaryOp::mul: return body([](float x, float y) { return math::binary(BinaryOp::mul, x, y); });
    case BinaryOp::max: return body([](float x, float y) { return math::binary(BinaryOp::max, x, y); });
  }
}

// The activations' loops, the most expensive element-wise work of a GPT step (GELU's exp), are compiled
// for AVX2 too (COURSE_CPU_CLONES, cpu_vector.h): the same bits either way.
COURSE_CPU_CLONES void unary_loop(UnaryOp op, const float* in, float* out, std::size_t begin, std::size_t end) {
  switch (op) {
    case UnaryOp::relu:
      for (std::size_t i = begin; i < end; ++i) out[i] = math::unary(UnaryOp::relu, in[i]);
      break;
    case UnaryOp::gelu:
      for (std::size_t i = begin; i < end; ++i) out[i] = math::unary(UnaryOp::gelu, in[i]);
      break;
    case UnaryOp::gelu_tanh:
      for (std::size_t i = begin; i < end; ++i) out[i] = math::unary(UnaryOp::gelu_tanh, in[i]);
      break;
  }
}

COURSE_CPU_CLONES void unary_backward_loop(UnaryOp op, const float* in, const float* g, float* out, std::size_t begin,
                                           std::size_t end) {
  switch (op) {
    case UnaryOp::relu:
      for (std::size_t i = begin; i < end; ++i) out[i] = math::unary_backward(UnaryOp::relu, in[i], g[i]);
      break;
    case UnaryOp::gelu:
      for (std::size_t i = begin; i < end; ++i) out[i] = math::unary_backward(UnaryOp::gelu, in[i], g[i]);
      break;
    case UnaryOp::gelu_tanh:
      for (std::size_t i = begin; i < end; ++i) out[i] = math::unary_backward(UnaryOp::gelu_tanh, in[i], g[i]);
      break;
  }
}

COURSE_CPU_CLONES void layer_norm_rows(const float* x, const float* w, const float* b, std::size_t first, std::size_t end,
                                       std::size_t cols, float eps, float* out, float* mean, float* rstd) {
  for (std::size_t r = first; r < end; ++r)
    math::layer_norm_row(math::AllLanes{}, x + r * cols, w, b, cols, eps, out + r * cols, mean + r, rstd + r);
}

COURSE_CPU_CLONES void layer_norm_backward_rows(const float* x, const float* w, const float* mean, const float* rstd,
                                                const float* g, std::size_t first, std::size_t end, std::size_t cols,
                                                float* dx) {
  for (std::size_t r = first; r < end; ++r)
    math::layer_norm_backward_row(math::AllLanes{}, x + r * cols, w, mean[r], rstd[r], g + r * cols, cols, dx + r * cols);
}

// Columns [first, end) of a two-stage column sum (math::column_chunks): each chunk's sums read row by row
// (contiguous), then added to the columns' totals in chunk order, as the GPU's two stages add them.
template <class Chunk>
void column_sums(std::size_t rows, std::size_t first, std::size_t end, int outputs, Chunk chunk_sums,
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

COURSE_CPU_CLONES void layer_norm_params_columns(const float* x, const float* mean, const float* rstd, const float* g,
                                                 std::size_t rows, std::size_t cols, std::size_t first, std::size_t end,
                                                 float* dw, float* db) {
  const std::size_t n = end - first;
  column_sums(
      rows, first, end, 2,
      [&](std::size_t r, double* chunk) {  // math::layer_norm_params_chunk's terms, row r of every column
        const float *xr = x + r * cols + first, *gr = g + r * cols + first;
        for (std::size_t c = 0; c < n; ++c) {
          chunk[c] = rn::add(chunk[c], math::layer_norm_weight_term(xr[c], mean[r], rstd[r], gr[c]));
          chunk[n + c] = rn::add(chunk[n + c], static_cast<double>(gr[c]));
        }
      },
      [&](int o, std::size_t c, float value) { (o == 0 ? dw : db)[c] = value; });
}

// Cross-entropy row by row (math::cross_entropy_row, the lanes side by side: the loops vectorise).
COURSE_CPU_CLONES void cross_entropy_rows(const float* logits, const float* targets, std::size_t first, std::size_t end,
                                          std::size_t cols, float* losses) {
  for (std::size_t r = first; r < end; ++r)  // an ignored row (a negative target, ignore_index): no loss
    losses[r] = targets[r] < 0.0f ? 0.0f
                                  : math::cross_entropy_row(math::AllLanes{}, logits + r * cols, cols,
                                                            static_cast<std::size_t>(targets[r]));
}

COURSE_CPU_CLONES void cross_entropy_backward_rows(const float* logits, const float* targets, const float* g,
                                                   std::size_t first, std::size_t end, std::size_t cols, float* out) {
  for (std::size_t r = first; r < end; ++r) {
    float* dst = out + r * cols;
    if (targets[r] < 0.0f) std::fill(dst, dst + cols, 0.0f);  // an ignored row: no gradient
    else math::cross_entropy_backward_row(math::AllLanes{}, logits + r * cols, cols, static_cast<std::size_t>(targets[r]), g[r], dst);
  }
}

// The cross-entropy of one float row (a 16-bit row widened), keeping the row's top and total; and its
// gradient from them. The float32 kernels' formulas; here so that their loops vectorise as those do.
COURSE_CPU_CLONES void cross_entropy_stats_row(const float* row, std::size_t cols, float target, float* loss,
                                               float* top, double* total) {
  const math::RowExpSum e = math::row_exp_sum(math::AllLanes{}, row, cols);
  *top = e.top, *total = e.total;
  *loss = target < 0.0f ? 0.0f : math::cross_entropy_of(e, row, static_cast<std::size_t>(target));
}
COURSE_CPU_CLONES void cross_entropy_backward_stats_row(const float* row, std::size_t cols, std::size_t target, float g,
                                                        float top, double total, float* out) {
  math::cross_entropy_backward_of(math::AllLanes{}, math::RowExpSum{top, total}, row, cols, target, g, out);
}

// n 16-bit values widened exactly into floats, and floats rounded once into 16 bits: the format a
// constant of the loop, so that it vectorises. from_half, to_half and every 16-bit kernel's blocks.
void widen_into(HalfFormat format, const std::uint16_t* in, float* out, std::size_t n) {
  half::with_format(format, [&](auto f) {
    for (std::size_t i = 0; i < n; ++i) out[i] = half::widen<decltype(f)::value>(in[i]);
  });
}
void narrow_into(HalfFormat format, const float* in, std::uint16_t* out, std::size_t n) {
  half::with_format(format, [&](auto f) {
    for (std::size_t i = 0; i < n; ++i) out[i] = half::narrow<decltype(f)::value>(in[i]);
  });
}

// Rows [first, end) of 16-bit logits through `body(r, widened row, float scratch)`, a row at a time.
template <class Body>
void for_each_widened_row(HalfFormat format, const std::uint16_t* logits, std::size_t first, std::size_t end,
                          std::size_t cols, Body body) {
  std::vector<float> row(cols), scratch(cols);
  for (std::size_t r = first; r < end; ++r) {
    widen_into(format, logits + r * cols, row.data(), cols);
    body(r, row.data(), scratch.data());
  }
}

// n 16-bit values widened into a new float vector.
std::vector<float> widened(HalfFormat format, const std::uint16_t* in, std::int64_t n) {
  std::vector<float> out(static_cast<std::size_t>(n));
  parallel_for(out.size(), 1, [&](std::size_t b, std::size_t e) { widen_into(format, in + b, out.data() + b, e - b); });
  return out;
}

// A 16-bit element-wise kernel as its float32 loop on blocks: each thread takes kHalfBlock elements at a
// time, `body(first, count, results)` widens its operands' values for [first, first + count) and runs the
// float32 loop into `results`, which are rounded into out once. Blocks change no arithmetic.
constexpr std::size_t kHalfBlock = 1024;
template <class Body>
void in_half_blocks(HalfFormat format, std::uint16_t* out, std::size_t n, Body body) {
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
void widen_repeated(HalfFormat format, const std::uint16_t* in, std::size_t size, std::size_t first, std::size_t count,
                    float* out) {
  for (std::size_t done = 0; done < count;) {  // runs of the operand that do not wrap round
    const std::size_t at = (first + done) % size, run = std::min(count - done, size - at);
    widen_into(format, in + at, out + done, run);
    done += run;
  }
}

class CpuKernels final : public Kernels {
 public:
  void fill(float* out, std::size_t n, float value) override {
    parallel_for(n, 1, [&](std::size_t b, std::size_t e) { std::fill(out + b, out + e, value); });
  }
  void fill_bits(std::uint16_t* out, std::size_t n, std::uint16_t bits) override {
    parallel_for(n, 1, [&](std::size_t b, std::size_t e) { std::fill(out + b, out + e, bits); });
  }
  void copy(float* out, const float* in, std::size_t n) override {
    parallel_for(n, 1, [&](std::size_t b, std::size_t e) { std::copy(in + b, in + e, out + b); });
  }

  void gemm(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const float* a,
            const float* b, float beta, float* c) override {
    if (m == 0 || n == 0) return;
    if (k == 0) {  // BLAS leaves C untouched for k == 0 only when beta == 1
      for (std::int64_t i = 0; i < m * n; ++i) c[i] = beta == 0.0f ? 0.0f : beta * c[i];
      return;
    }
    cpu::sgemm(ta, tb, m, n, k, alpha, a, ta ? m : k, b, tb ? k : n, beta, c, n);
  }

  void gemm_batched(bool ta, bool tb, std::int64_t batch, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
                    const float* a, std::int64_t sa, const float* b, std::int64_t sb, float beta, float* c,
                    std::int64_t sc) override {
    // Attention's GEMMs are many and tiny (one per sequence and head): the threads take whole matrices
    // (OpenBLAS runs single-threaded inside an OpenMP region), as PyTorch's bmm does on the CPU.
    parallel_for(static_cast<std::size_t>(batch), static_cast<std::size_t>(m * n * std::max<std::int64_t>(k, 1)),
                 [&](std::size_t first, std::size_t end) {
                   for (auto i = static_cast<std::int64_t>(first); i < static_cast<std::int64_t>(end); ++i)
                     gemm(ta, tb, m, n, k, alpha, a + i * sa, b + i * sb, beta, c + i * sc);
                 });
  }

  void gemm_batched_half(HalfFormat format, bool ta, bool tb, std::int64_t batch, std::int64_t m, std::int64_t n,
                         std::int64_t k, float alpha, const std::uint16_t* a, std::int64_t sa, const std::uint16_t* b,
                         std::int64_t sb, float beta, std::uint16_t* c, std::int64_t sc) override {
    if (batch == 0 || m == 0 || n == 0) return;
    // Every element the strided matrices reach, widened once; C's rounding is the only one.
    auto span = [batch](std::int64_t stride, std::int64_t size) { return static_cast<std::size_t>((batch - 1) * stride + size); };
    std::vector<float> wa(span(sa, m * k)), wb(span(sb, k * n)), wc(span(sc, m * n), 0.0f);
    from_half(format, a, wa.data(), wa.size());
    from_half(format, b, wb.data(), wb.size());
    if (beta != 0.0f) from_half(format, c, wc.data(), wc.size());
    gemm_batched(ta, tb, batch, m, n, k, alpha, wa.data(), sa, wb.data(), sb, beta, wc.data(), sc);
    for (std::int64_t i = 0; i < batch; ++i)
      to_half(format, wc.data() + i * sc, c + i * sc, static_cast<std::size_t>(m * n));
  }

  void binary(BinaryOp op, const float* a, std::size_t an, const float* b, std::size_t bn, float* out,
              std::size_t n) override {
    with_binary_op(op, [&](auto f) {
      if (an == n && bn == n) {  // the common case
        elementwise(n, [&](std::size_t i) { out[i] = f(a[i], b[i]); });
      } else if (an == n && bn > 0 && n % bn == 0) {  // b repeated row by row: a bias, a scalar
        parallel_for(n / bn, bn, [&](std::size_t first, std::size_t end) {
          for (std::size_t r = first * bn; r < end * bn; r += bn)
            for (std::size_t j = 0; j < bn; ++j) out[r + j] = f(a[r + j], b[j]);
        });
      } else if (bn == n && an > 0 && n % an == 0) {
        parallel_for(n / an, an, [&](std::size_t first, std::size_t end) {
          for (std::size_t r = first * an; r < end * an; r += an)
            for (std::size_t j = 0; j < an; ++j) out[r + j] = f(a[j], b[r + j]);
        });
      } else {
        elementwise(n, [&](std::size_t i) { out[i] = f(a[i % an], b[i % bn]); });
      }
    });
  }

  void binary_broadcast(BinaryOp op, const float* a, const float* b, float* out, const BroadcastIndex& ix) override {
    with_binary_op(op, [&](auto f) {
      for_each_offset(ix, [&](std::int64_t i, std::int64_t ao, std::int64_t bo) { out[i] = f(a[ao], b[bo]); });
    });
  }

  void gather(const float* in, float* out, const BroadcastIndex& ix) override {
    for_each_offset(ix, [&](std::int64_t i, std::int64_t o, std::int64_t) { out[i] = in[o]; });
  }

  void sum_to(const float* in, float* out, std::size_t out_n, const BroadcastIndex& ix) override {
    std::vector<double> total(out_n, 0.0);
    for_each_offset_serial(ix, [&](std::int64_t i, std::int64_t o) { total[static_cast<std::size_t>(o)] += in[i]; });
    for (std::size_t j = 0; j < out_n; ++j) out[j] = static_cast<float>(total[j]);
  }

  void to_half(HalfFormat format, const float* in, std::uint16_t* out, std::size_t n) override {
    parallel_for(n, 1, [&](std::size_t b, std::size_t e) { narrow_into(format, in + b, out + b, e - b); });
  }
  void from_half(HalfFormat format, const std::uint16_t* in, float* out, std::size_t n) override {
    parallel_for(n, 1, [&](std::size_t b, std::size_t e) { widen_into(format, in + b, out + b, e - b); });
  }

  void binary_half(HalfFormat format, BinaryOp op, const std::uint16_t* a, std::size_t an, const std::uint16_t* b,
                   std::size_t bn, std::uint16_t* out, std::size_t n) override {
    if (!n) return;
    with_binary_op(op, [&](auto f) {
      in_half_blocks(format, out, n, [&](std::size_t first, std::size_t count, float* results) {
        float wa[kHalfBlock], wb[kHalfBlock];
        widen_repeated(format, a, an, first, count, wa);
        widen_repeated(format, b, bn, first, count, wb);
        for (std::size_t i = 0; i < count; ++i) results[i] = f(wa[i], wb[i]);
      });
    });
  }
  void unary_half(HalfFormat format, UnaryOp op, const std::uint16_t* in, std::uint16_t* out, std::size_t n) override {
    in_half_blocks(format, out, n, [&](std::size_t first, std::size_t count, float* results) {
      float x[kHalfBlock];
      widen_into(format, in + first, x, count);
      unary_loop(op, x, results, 0, count);
    });
  }
  void unary_backward_half(HalfFormat format, UnaryOp op, const std::uint16_t* in, const std::uint16_t* g,
                           std::uint16_t* out, std::size_t n) override {
    in_half_blocks(format, out, n, [&](std::size_t first, std::size_t count, float* results) {
      float x[kHalfBlock], gx[kHalfBlock];
      widen_into(format, in + first, x, count);
      widen_into(format, g + first, gx, count);
      unary_backward_loop(op, x, gx, results, 0, count);
    });
  }
  void add_half(HalfFormat format, const std::uint16_t* in, float* acc, std::size_t n) override {
    parallel_for(n, 1, [&](std::size_t begin, std::size_t end) {
      float x[kHalfBlock];
      for (std::size_t first = begin; first < end; first += kHalfBlock) {
        const std::size_t count = std::min(kHalfBlock, end - first);
        widen_into(format, in + first, x, count);
        for (std::size_t i = 0; i < count; ++i) acc[first + i] = math::binary(BinaryOp::add, acc[first + i], x[i]);
      }
    });
  }
  void scale(const float* in, float factor, float* out, std::size_t n) override {
    elementwise(n, [&](std::size_t i) { out[i] = rn::mul(in[i], factor); });
  }

  void sum(const float* in, std::size_t n, float* out) override {
    double total = 0.0;  // double accumulation: the reference should not lose bits to summation order
    for (std::size_t i = 0; i < n; ++i) total += in[i];
    *out = static_cast<float>(total);
  }

  void sum_rows(const float* in, std::size_t rows, std::size_t cols, float* out) override {
    // In the two stages of math::column_chunks (the GPU's order), row by row within a chunk; the threads
    // take blocks of columns, so every column is summed in the same order at any thread count.
    parallel_for(cols, rows, [&](std::size_t first, std::size_t end) {
      column_sums(
          rows, first, end, 1,
          [&](std::size_t r, double* chunk) {
            for (std::size_t j = first; j < end; ++j) chunk[j - first] = rn::add(chunk[j - first], static_cast<double>(in[r * cols + j]));
          },
          [&](int, std::size_t j, float value) { out[j] = value; });
    });
  }

  void unary(UnaryOp op, const float* in, float* out, std::size_t n) override {
    parallel_for(n, 1, [&](std::size_t begin, std::size_t end) { unary_loop(op, in, out, begin, end); });
  }

  void unary_backward(UnaryOp op, const float* in, const float* g, float* out, std::size_t n) override {
    parallel_for(n, 1, [&](std::size_t begin, std::size_t end) { unary_backward_loop(op, in, g, out, begin, end); });
  }

  void layer_norm(const float* x, const float* w, const float* b, std::size_t rows, std::size_t cols, float eps,
                  float* out, float* mean, float* rstd) override {
    parallel_for(rows, cols, [&](std::size_t first, std::size_t end) { layer_norm_rows(x, w, b, first, end, cols, eps, out, mean, rstd); });
  }

  void layer_norm_backward(const float* x, const float* w, const float* mean, const float* rstd, const float* g,
                           std::size_t rows, std::size_t cols, float* dx, float* dw, float* db) override {
    parallel_for(rows, cols, [&](std::size_t first, std::size_t end) {
      layer_norm_backward_rows(x, w, mean, rstd, g, first, end, cols, dx);
    });
    // The parameters' gradients: a block of columns per thread, the rows read in order (contiguous),
    // each column's sums in math::layer_norm_params_chunk's arithmetic and the two stages' order.
    parallel_for(cols, rows, [&](std::size_t first, std::size_t end) {
      layer_norm_params_columns(x, mean, rstd, g, rows, cols, first, end, dw, db);
    });
  }

  void embedding(const float* ids, const float* weight, std::size_t n, std::size_t dim, std::size_t, float* out) override {
    parallel_for(n, dim, [&](std::size_t first, std::size_t end) {
      for (std::size_t i = first; i < end; ++i)
        std::copy_n(weight + static_cast<std::size_t>(ids[i]) * dim, dim, out + i * dim);
    });
  }

  void embedding_backward(const float* ids, const float* g, std::size_t n, std::size_t dim, std::size_t vocab,
                          float* dw) override {
    fill(dw, vocab * dim, 0.0f);
    // The threads take blocks of the dimension, every one walking the ids in order: no two write the
    // same element, and each element adds its rows in increasing i, at any thread count.
    parallel_for(dim, n, [&](std::size_t first, std::size_t end) {
      for (std::size_t i = 0; i < n; ++i) {
        float* row = dw + static_cast<std::size_t>(ids[i]) * dim;
        for (std::size_t d = first; d < end; ++d) row[d] += g[i * dim + d];
      }
    });
  }

  void softmax(const float* in, std::size_t rows, std::size_t cols, bool causal, float* out) override {
    parallel_for(rows, cols, [&](std::size_t first, std::size_t end) {
    for (std::size_t r = first; r < end; ++r) {
      const std::size_t visible = causal ? r % cols + 1 : cols;  // query i sees keys 0..i
      const float* row = in + r * cols;
      float top = *std::max_element(row, row + visible);
      double total = 0.0;
      for (std::size_t c = 0; c < visible; ++c) total += std::exp(static_cast<double>(row[c] - top));
      for (std::size_t c = 0; c < cols; ++c)
        out[r * cols + c] =
            c < visible ? static_cast<float>(std::exp(static_cast<double>(row[c] - top)) / total) : 0.0f;
    }
    });
  }

  void softmax_backward(const float* y, const float* g, std::size_t rows, std::size_t cols, float* dx) override {
    parallel_for(rows, cols, [&](std::size_t first, std::size_t end) {
    for (std::size_t r = first; r < end; ++r) {
      double dot = 0.0;
      for (std::size_t c = 0; c < cols; ++c) dot += static_cast<double>(g[r * cols + c]) * y[r * cols + c];
      for (std::size_t c = 0; c < cols; ++c)
        dx[r * cols + c] = static_cast<float>(y[r * cols + c] * (g[r * cols + c] - dot));
    }
    });
  }

  void attention(const float* qkv, const AttentionShape& shape, float* probs, float* y) override {
    cpu::attention(qkv, shape, probs, y);
  }
  void attention_backward(const float* qkv, const float* probs, const float* grad_y, const AttentionShape& shape,
                          float* grad_qkv) override {
    cpu::attention_backward(qkv, probs, grad_y, shape, grad_qkv);
  }
  void flash_attention(const float* qkv, const AttentionShape& shape, float* lse, float* y) override {
    cpu::flash_attention(qkv, shape, lse, y);
  }
  void flash_attention_backward(const float* qkv, const float* y, const float* lse, const float* grad_y,
                                const AttentionShape& shape, float* grad_qkv) override {
    cpu::flash_attention_backward(qkv, y, lse, grad_y, shape, grad_qkv);
  }
  // A slice of sequences at a time (an eighth of the batch, as the ops slice 16-bit work): widened into
  // floats, the float32 kernel, its outputs rounded once. Each sequence's attention is its own, and dropout
  // draws by the index in the whole batch (first_sequence), so slicing changes no bit.
  void flash_attention_half(HalfFormat format, const std::uint16_t* qkv, const AttentionShape& s, float* lse,
                            std::uint16_t* y) override {
    const std::int64_t width = 3 * s.heads * s.head_size, c = s.heads * s.head_size;
    for_sequence_slices(s, (s.batch + 7) / 8, [&](const AttentionShape& part, std::int64_t first) {
      std::vector<float> wide_qkv = widened(format, qkv + first * s.tokens * width, part.batch * s.tokens * width),
                         wide_y(static_cast<std::size_t>(part.batch * s.tokens * c));
      cpu::flash_attention(wide_qkv.data(), part, lse + first * s.heads * s.tokens, wide_y.data());
      to_half(format, wide_y.data(), y + first * s.tokens * c, wide_y.size());
    });
  }
  void flash_attention_backward_half(HalfFormat format, const std::uint16_t* qkv, const std::uint16_t* y,
                                     const float* lse, const std::uint16_t* grad_y, const AttentionShape& s,
                                     std::uint16_t* grad_qkv) override {
    const std::int64_t width = 3 * s.heads * s.head_size, c = s.heads * s.head_size;
    for_sequence_slices(s, (s.batch + 7) / 8, [&](const AttentionShape& part, std::int64_t first) {
      const std::int64_t rows = part.batch * s.tokens;
      std::vector<float> wide_qkv = widened(format, qkv + first * s.tokens * width, rows * width),
                         wide_y = widened(format, y + first * s.tokens * c, rows * c),
                         wide_g = widened(format, grad_y + first * s.tokens * c, rows * c),
                         grad(static_cast<std::size_t>(rows * width));
      cpu::flash_attention_backward(wide_qkv.data(), wide_y.data(), lse + first * s.heads * s.tokens, wide_g.data(),
                                    part, grad.data());
      to_half(format, grad.data(), grad_qkv + first * s.tokens * width, grad.size());
    });
  }

  void attention_block(const float* q, const float* k, const float* v, const float* q_pos, const float* k_pos,
                       const AttentionBlockShape& shape, float* row_max, float* row_sum, float* out) override {
    cpu::attention_block(q, k, v, q_pos, k_pos, shape, row_max, row_sum, out);
  }
  void attention_block_finish(const float* row_max, const float* row_sum, const AttentionBlockShape& shape, float* out,
                              float* lse) override {
    cpu::attention_block_finish(row_max, row_sum, shape, out, lse);
  }
  void attention_block_backward(const float* q, const float* k, const float* v, const float* q_pos, const float* k_pos,
                                const float* out, const float* lse, const float* grad_out, const AttentionBlockShape& shape,
                                float* grad_q, float* grad_k, float* grad_v) override {
    cpu::attention_block_backward(q, k, v, q_pos, k_pos, out, lse, grad_out, shape, grad_q, grad_k, grad_v);
  }

  void cross_entropy(const float* logits, const float* targets, std::size_t rows, std::size_t cols,
                     float* losses) override {
    parallel_for(rows, cols, [&](std::size_t first, std::size_t end) {
      cross_entropy_rows(logits, targets, first, end, cols, losses);
    });
  }

  void cross_entropy_backward(const float* logits, const float* targets, const float* g, std::size_t rows,
                              std::size_t cols, float* out) override {
    parallel_for(rows, cols, [&](std::size_t first, std::size_t end) {
      cross_entropy_backward_rows(logits, targets, g, first, end, cols, out);
    });
  }

  // The 16-bit logits a row at a time, widened (exactly) into a float row: the float32 kernels' loops on
  // it, so the same bits, vectorised as those are; the gradient rounded once into 16 bits.
  void cross_entropy_half(HalfFormat format, const std::uint16_t* logits, const float* targets, std::size_t rows,
                          std::size_t cols, float* losses, float* top, double* total) override {
    parallel_for(rows, cols, [&](std::size_t first, std::size_t end) {
      for_each_widened_row(format, logits, first, end, cols, [&](std::size_t r, const float* row, float*) {
        cross_entropy_stats_row(row, cols, targets[r], losses + r, top + r, total + r);
      });
    });
  }

  void cross_entropy_backward_half(HalfFormat format, const std::uint16_t* logits, const float* targets,
                                   const float* g, const float* top, const double* total, std::size_t rows,
                                   std::size_t cols, std::uint16_t* out) override {
    parallel_for(rows, cols, [&](std::size_t first, std::size_t end) {
      for_each_widened_row(format, logits, first, end, cols, [&](std::size_t r, const float* row, float* grad) {
        std::uint16_t* dst = out + r * cols;
        if (targets[r] < 0.0f) {  // an ignored row: no gradient
          std::fill(dst, dst + cols, std::uint16_t{0});
          return;
        }
        cross_entropy_backward_stats_row(row, cols, static_cast<std::size_t>(targets[r]), g[r], top[r], total[r], grad);
        if (format == HalfFormat::bfloat16)
          for (std::size_t c = 0; c < cols; ++c) dst[c] = half::to_bfloat16(grad[c]);
        else
          for (std::size_t c = 0; c < cols; ++c) dst[c] = half::to_float16(grad[c]);
      });
    });
  }

  void arange(float* out, std::size_t n) override {
    elementwise(n, [&](std::size_t i) { out[i] = static_cast<float>(i); });
  }
  void dropout(const float* in, float* out, std::size_t n, float p, std::uint64_t seed, std::uint64_t first) override {
    elementwise(n, [&](std::size_t i) { out[i] = rn::mul(in[i], math::dropout_keep(seed, first + i, p)); });
  }
  void add_squares(const float* in, std::size_t n, double* total) override { *total = squares_tiled(in, n, *total); }
  void clip_coefficient(const double* total, double max_norm, float* norm, float* factor) override {
    *norm = static_cast<float>(std::sqrt(*total));
    *factor = math::clip_coefficient(*norm, max_norm);
  }
  void scale_by(const float* in, const float* factor, float* out, std::size_t n) override {
    if (*factor == 1.0f && in == out) return;
    scale(in, *factor, out, n);
  }
  void check_indices(IndexCheck check, const float* ids, std::size_t n, std::size_t limit, float ignore_index) override {
    for (std::size_t i = 0; i < n; ++i)
      if (!math::valid_index(ids[i], limit, ignore_index))
        throw std::invalid_argument(index_check_message(check, ids[i], limit));
  }
  void inverse_count(const float* targets, std::size_t n, float ignore_index, float* inverse) override {
    std::size_t kept = 0;
    for (std::size_t i = 0; i < n; ++i) kept += targets[i] != ignore_index;
    if (!kept) throw std::invalid_argument(index_check_message(IndexCheck::every_target_ignored, 0.0f, 0));
    *inverse = 1.0f / static_cast<float>(kept);
  }
  void sgd_step(float* p, const float* g, float* buf, std::size_t n, const SgdParams& s) override {
    if (buf) {
      elementwise(n, [&](std::size_t i) { p[i] = math::sgd_update(p[i], g[i], buf[i], s.lr, s.momentum, s.weight_decay); });
    } else {  // without momentum there is no buffer: buf = 0 * buf + g
      elementwise(n, [&](std::size_t i) {
        float none = 0.0f;
        p[i] = math::sgd_update(p[i], g[i], none, s.lr, s.momentum, s.weight_decay);
      });
    }
  }

  // The GPU's chunks (multi_tensor.h), each chunk's elements in order.
  void adam_step(const std::vector<AdamTensor>& list, const AdamParams& a) override {
    math::for_each_multi_tensor_launch(list, [&](const AdamTensor* tensors, int, const math::MultiTensorChunks& chunks) {
      parallel_for(chunks.first[chunks.count], 1, [&](std::size_t first, std::size_t last) {
        for (std::size_t chunk = first; chunk < last; ++chunk) {
          const math::ChunkRange r = math::multi_tensor_range(chunks, tensors, chunk);
          const AdamTensor& x = tensors[r.tensor];
          for (std::size_t i = r.begin; i < r.end; ++i)
            x.param[i] = math::adam_update(x.param[i], x.grad[i], x.m[i], x.v[i], a.lr, a.beta1, a.beta2, a.eps,
                                           x.weight_decay, a.decoupled_weight_decay, a.bias_correction1,
                                           a.bias_correction2);
          if (a.zero_grad) std::fill(x.grad + r.begin, x.grad + r.end, 0.0f);
        }
      });
    });
  }
};

}  // namespace

double squares_tiled(const float* in, std::size_t n, double total) {
  const auto threads = static_cast<std::size_t>(kSquaresThreads), stride_all = threads * kSquaresBlocks;
  std::array<double, kSquaresThreads> share{};
  for (std::size_t b = 0; b < static_cast<std::size_t>(kSquaresBlocks); ++b) {
    for (std::size_t t = 0; t < threads; ++t) {
      double sum = 0.0;
      for (std::size_t i = b * threads + t; i < n; i += stride_all) {
        const auto x = static_cast<double>(in[i]);
        sum = rn::add(sum, rn::mul(x, x));
      }
      share[t] = sum;
    }
    for (std::size_t stride = threads / 2; stride > 0; stride /= 2)
      for (std::size_t t = 0; t < stride; ++t) share[t] = rn::add(share[t], share[t + stride]);
    total = rn::add(total, share[0]);
  }
  return total;
}

Kernels& cpu_kernels() {
  static CpuKernels instance;
  return instance;
}

#if COURSE_HAVE_CUDA
Kernels& cuda_kernels();  // cuda_kernels.cu
#endif

namespace {
std::atomic<bool>& tf32_setting() {
  static std::atomic<bool> allowed{false};
  return allowed;
}
}  // namespace

void set_allow_tf32(bool allow) { tf32_setting() = allow; }
bool allow_tf32() { return tf32_setting(); }

Kernels& kernels(Device device) {
  if (device == Device::cpu) return cpu_kernels();
#if COURSE_HAVE_CUDA
  return cuda_kernels();
#else
  throw std::runtime_error("a CUDA kernel was requested in a build without the CUDA backend");
#endif
}

namespace {
// One setting for the whole process. OpenMP's own (omp_set_num_threads) belongs to the calling thread
// only, and chapter 05's communication thread runs kernels too: it would still use every core, and
// ranks sharing a machine would fight over them.
std::atomic<int>& thread_setting() {
#ifdef _OPENMP
  static std::atomic<int> threads{omp_get_max_threads()};  // OMP_NUM_THREADS, or every core
#else
  static std::atomic<int> threads{1};
#endif
  return threads;
}
}  // namespace

void set_cpu_threads(int threads, int gemm_threads) {
  threads = std::max(1, threads);
  thread_setting() = threads;
  cpu::set_gemm_threads(gemm_threads > 0 ? gemm_threads : threads);
}
int cpu_threads() { return thread_setting(); }

}  // namespace course
