// CUDA kernels: the same interface as cpu_kernels.cpp, checked against it by the parity tests.
// Reductions use a fixed thread-to-data mapping and a fixed tree, never atomics, so they are
// deterministic: the same inputs give the same bits on every run.
#include <cublas_v2.h>

#include <cmath>
#include <mutex>
#include <vector>

#include "common/core/cuda_check.h"
#include "common/core/cuda_runtime.h"
#include "common/core/index_check.h"
#include "common/kernels/cublas_library.h"
#include "common/kernels/cuda_embedding_backward.h"
#include "common/kernels/cuda_flash_attention.h"
#include "common/kernels/kernels.h"
#include "common/kernels/half.h"
#include "common/kernels/math.h"
#include "common/kernels/multi_tensor.h"
#include "common/kernels/rows.h"
#include "common/tensor/random.h"

namespace course {
namespace {

// ---- kernels ------------------------------------------------------------------------------------

constexpr int kThreads = 256;
constexpr int kReduceThreads = 1024;

__global__ void fill_kernel(float* out, std::size_t n, float value) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) out[i] = value;
}

__global__ void fill_bits_kernel(std::uint16_t* out, std::size_t n, std::uint16_t bits) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) out[i] = bits;
}

__global__ void to_half_kernel(HalfFormat format, const float* in, std::uint16_t* out, std::size_t n) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    out[i] = format == HalfFormat::float16 ? half::to_float16(in[i]) : half::to_bfloat16(in[i]);
}

__global__ void from_half_kernel(HalfFormat format, const std::uint16_t* in, float* out, std::size_t n) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    out[i] = format == HalfFormat::float16 ? half::from_float16(in[i]) : half::from_bfloat16(in[i]);
}

__global__ void binary_kernel(BinaryOp op, const float* a, std::size_t an, const float* b, std::size_t bn,
                              float* out, std::size_t n) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    out[i] = math::binary(op, a[an == n ? i : i % an], b[bn == n ? i : i % bn]);
  }
}

// The 16-bit element-wise kernels (Kernels::binary_half, ...): the float32 kernels' formulas on the exact
// widening of each value, each result rounded once; the format a template argument, so no branch per element.
template <HalfFormat F>
__global__ void binary_half_kernel(BinaryOp op, const std::uint16_t* a, std::size_t an, const std::uint16_t* b,
                                   std::size_t bn, std::uint16_t* out, std::size_t n) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    out[i] = half::narrow<F>(math::binary(op, half::widen<F>(a[an == n ? i : i % an]), half::widen<F>(b[bn == n ? i : i % bn])));
}

template <HalfFormat F>
__global__ void unary_half_kernel(UnaryOp op, const std::uint16_t* in, std::uint16_t* out, std::size_t n) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    out[i] = half::narrow<F>(math::unary(op, half::widen<F>(in[i])));
}

template <HalfFormat F>
__global__ void unary_backward_half_kernel(UnaryOp op, const std::uint16_t* in, const std::uint16_t* g,
                                           std::uint16_t* out, std::size_t n) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    out[i] = half::narrow<F>(math::unary_backward(op, half::widen<F>(in[i]), half::widen<F>(g[i])));
}

template <HalfFormat F>
__global__ void add_half_kernel(const std::uint16_t* in, float* acc, std::size_t n) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    acc[i] = math::binary(BinaryOp::add, acc[i], half::widen<F>(in[i]));
}

__global__ void scale_kernel(const float* in, float factor, float* out, std::size_t n) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    out[i] = rn::mul(in[i], factor);
}

// One block; thread t sums elements t, t+1024, ... in double, then a fixed tree combines the partials.
__global__ void sum_kernel(const float* in, std::size_t n, float* out) {
  __shared__ double partial[kReduceThreads];
  double total = 0.0;
  for (std::size_t i = threadIdx.x; i < n; i += blockDim.x) total += in[i];
  partial[threadIdx.x] = total;
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) partial[threadIdx.x] += partial[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0) *out = static_cast<float>(partial[0]);
}

// Column sums in math::column_chunks' two stages: a thread per column and chunk of rows (coalesced reads
// along a row), then a thread per column adding its chunks in order. The CPU's bits.
__global__ void sum_rows_chunks_kernel(const float* in, std::size_t rows, std::size_t cols, double* partial) {
  for (std::size_t c = blockIdx.x * blockDim.x + threadIdx.x; c < cols; c += gridDim.x * blockDim.x)
    for (std::size_t chunk = blockIdx.y; chunk < math::column_chunks(rows); chunk += gridDim.y)
      partial[chunk * cols + c] = math::column_chunk_sum(in, rows, cols, chunk, c);
}

__global__ void column_totals_kernel(const double* partial, std::size_t chunks, std::size_t cols, float* out) {
  for (std::size_t c = blockIdx.x * blockDim.x + threadIdx.x; c < cols; c += gridDim.x * blockDim.x)
    out[c] = math::column_total(partial, chunks, cols, c);
}

__global__ void unary_kernel(UnaryOp op, const float* in, float* out, std::size_t n) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    out[i] = math::unary(op, in[i]);
}

__global__ void unary_backward_kernel(UnaryOp op, const float* in, const float* g, float* out, std::size_t n) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    out[i] = math::unary_backward(op, in[i], g[i]);
}

// One thread per output element: its multi-index gives each operand's offset.
__global__ void binary_broadcast_kernel(BinaryOp op, const float* a, const float* b, float* out, BroadcastIndex ix,
                                        std::int64_t n) {
  for (std::int64_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    std::int64_t rest = i, ao = 0, bo = 0;
    for (int d = ix.rank - 1; d >= 0; --d) {
      const std::int64_t k = rest % ix.dims[d];
      rest /= ix.dims[d];
      ao += k * ix.a_strides[d];
      bo += k * ix.b_strides[d];
    }
    out[i] = math::binary(op, a[ao], b[bo]);
  }
}

__global__ void gather_kernel(const float* in, float* out, BroadcastIndex ix, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    std::int64_t rest = i, o = 0;
    for (int d = ix.rank - 1; d >= 0; --d) {
      o += (rest % ix.dims[d]) * ix.a_strides[d];
      rest /= ix.dims[d];
    }
    out[i] = in[o];
  }
}

// One thread per output element j: its kept dimensions come from j, and the reduced ones (stride 0)
// are walked in row-major order, so the in elements arrive in increasing index, in double, as on the CPU.
__global__ void sum_to_kernel(const float* in, float* out, std::size_t out_n, BroadcastIndex ix) {
  const std::size_t j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= out_n) return;
  std::int64_t in_strides[kMaxDims], reduced_count = 1, base = 0;
  std::int64_t stride = 1;
  for (int d = ix.rank - 1; d >= 0; --d) {
    in_strides[d] = stride;
    stride *= ix.dims[d];
  }
  std::int64_t rest = static_cast<std::int64_t>(j);
  for (int d = ix.rank - 1; d >= 0; --d) {
    if (ix.a_strides[d] == 0) {
      reduced_count *= ix.dims[d];
      continue;
    }
    const std::int64_t k = rest % ix.dims[d];
    rest /= ix.dims[d];
    base += k * in_strides[d];
  }
  double total = 0.0;
  for (std::int64_t r = 0; r < reduced_count; ++r) {
    std::int64_t left = r, offset = base;
    for (int d = ix.rank - 1; d >= 0; --d) {
      if (ix.a_strides[d] != 0) continue;
      offset += (left % ix.dims[d]) * in_strides[d];
      left /= ix.dims[d];
    }
    total += in[offset];
  }
  out[j] = static_cast<float>(total);
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

__global__ void cross_entropy_kernel(const float* logits, const float* targets, std::size_t rows, std::size_t cols,
                                     float* losses) {
  for_each_row_in_lanes(rows, [&](const GroupLanes& lanes, std::size_t r) {
    // An ignored row (or a bad target, raised later): no loss.
    const bool valid = math::valid_index(targets[r], cols, NAN);
    const float loss = valid ? math::cross_entropy_row(lanes, logits + r * cols, cols, static_cast<std::size_t>(targets[r])) : 0.0f;
    if (lanes.lane == 0) losses[r] = loss;
  });
}

__global__ void cross_entropy_backward_kernel(const float* logits, const float* targets, const float* g,
                                              std::size_t rows, std::size_t cols, float* out) {
  for_each_row_in_lanes(rows, [&](const GroupLanes& lanes, std::size_t r) {
    float* dst = out + r * cols;
    if (!math::valid_index(targets[r], cols, NAN)) {  // an ignored row (or a bad target): no gradient
      for (std::size_t c = lanes.first(); c < cols; c += lanes.stride()) dst[c] = 0.0f;
      return;
    }
    math::cross_entropy_backward_row(lanes, logits + r * cols, cols, static_cast<std::size_t>(targets[r]), g[r], dst);
  });
}

// The same on 16-bit logits (Kernels::cross_entropy_half): each row's top and total kept for backward.
template <HalfFormat F>
__global__ void cross_entropy_half_kernel(const std::uint16_t* logits, const float* targets, std::size_t rows,
                                          std::size_t cols, float* losses, float* top, double* total) {
  for_each_row_in_lanes(rows, [&](const GroupLanes& lanes, std::size_t r) {
    const half::In<F> row{logits + r * cols};
    const math::RowExpSum e = math::row_exp_sum(lanes, row, cols);
    const bool valid = math::valid_index(targets[r], cols, NAN);  // an ignored row (or a bad target): no loss
    const float loss = valid ? math::cross_entropy_of(e, row, static_cast<std::size_t>(targets[r])) : 0.0f;
    if (lanes.lane == 0) losses[r] = loss, top[r] = e.top, total[r] = e.total;
  });
}

template <HalfFormat F>
__global__ void cross_entropy_backward_half_kernel(const std::uint16_t* logits, const float* targets, const float* g,
                                                   const float* top, const double* total, std::size_t rows,
                                                   std::size_t cols, std::uint16_t* out) {
  for_each_row_in_lanes(rows, [&](const GroupLanes& lanes, std::size_t r) {
    std::uint16_t* dst = out + r * cols;
    if (!math::valid_index(targets[r], cols, NAN)) {  // an ignored row (or a bad target): no gradient
      for (std::size_t c = lanes.first(); c < cols; c += lanes.stride()) dst[c] = 0;
      return;
    }
    math::cross_entropy_backward_of(lanes, math::RowExpSum{top[r], total[r]}, half::In<F>{logits + r * cols}, cols,
                                    static_cast<std::size_t>(targets[r]), g[r], half::Out<F>{dst});
  });
}

// One thread per row, the CPU reference's arithmetic (exp and sums in double).
__global__ void softmax_kernel(const float* in, std::size_t rows, std::size_t cols, bool causal, float* out) {
  const std::size_t r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  const std::size_t visible = causal ? r % cols + 1 : cols;
  const float* row = in + r * cols;
  float top = row[0];
  for (std::size_t c = 1; c < visible; ++c) top = fmaxf(top, row[c]);
  double total = 0.0;
  for (std::size_t c = 0; c < visible; ++c) total += exp(static_cast<double>(row[c] - top));
  for (std::size_t c = 0; c < cols; ++c)
    out[r * cols + c] = c < visible ? static_cast<float>(exp(static_cast<double>(row[c] - top)) / total) : 0.0f;
}

__global__ void softmax_backward_kernel(const float* y, const float* g, std::size_t rows, std::size_t cols, float* dx) {
  const std::size_t r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  double dot = 0.0;
  for (std::size_t c = 0; c < cols; ++c) dot += static_cast<double>(g[r * cols + c]) * y[r * cols + c];
  for (std::size_t c = 0; c < cols; ++c) dx[r * cols + c] = static_cast<float>(y[r * cols + c] * (g[r * cols + c] - dot));
}

// Attention's probabilities in lanes (rows.h), over [batch x heads x tokens, tokens] scores: row r is
// query r % tokens, which sees every key, or with the causal mask keys 0 to itself. The CPU's formula.
__global__ void attention_softmax_kernel(float* scores, std::size_t rows, std::size_t tokens, bool causal) {
  for_each_row_in_lanes(rows, [&](const GroupLanes& lanes, std::size_t r) {
    math::attention_softmax_row(lanes, scores + r * tokens, causal ? r % tokens + 1 : tokens, tokens);
  });
}

__global__ void attention_softmax_backward_kernel(const float* p, float* dp, std::size_t rows, std::size_t tokens,
                                                  bool causal, float scale) {
  for_each_row_in_lanes(rows, [&](const GroupLanes& lanes, std::size_t r) {
    math::attention_softmax_backward_row(lanes, p + r * tokens, dp + r * tokens, causal ? r % tokens + 1 : tokens,
                                         tokens, scale);
  });
}

// Layer norm's rows in lanes (rows.h): the CPU's arithmetic, addition by addition.
__global__ void layer_norm_kernel(const float* x, const float* w, const float* b, std::size_t rows, std::size_t cols,
                                  float eps, float* out, float* mean, float* rstd) {
  for_each_row_in_lanes(rows, [&](const GroupLanes& lanes, std::size_t r) {
    math::layer_norm_row(lanes, x + r * cols, w, b, cols, eps, out + r * cols, mean + r, rstd + r);
  });
}

__global__ void layer_norm_backward_x_kernel(const float* x, const float* w, const float* mean, const float* rstd,
                                             const float* g, std::size_t rows, std::size_t cols, float* dx) {
  for_each_row_in_lanes(rows, [&](const GroupLanes& lanes, std::size_t r) {
    math::layer_norm_backward_row(lanes, x + r * cols, w, mean[r], rstd[r], g + r * cols, cols, dx + r * cols);
  });
}

// Stage 1 of the weight's and bias's gradients (math::layer_norm_params_chunk): a thread per column and
// chunk; `partial` holds the weight's chunk sums, then the bias's ([2, chunks, cols]).
__global__ void layer_norm_params_chunks_kernel(const float* x, const float* mean, const float* rstd, const float* g,
                                                std::size_t rows, std::size_t cols, double* partial) {
  const std::size_t chunks = math::column_chunks(rows);
  for (std::size_t c = blockIdx.x * blockDim.x + threadIdx.x; c < cols; c += gridDim.x * blockDim.x)
    for (std::size_t chunk = blockIdx.y; chunk < chunks; chunk += gridDim.y)
      math::layer_norm_params_chunk(x, mean, rstd, g, rows, cols, chunk, c, &partial[chunk * cols + c],
                                    &partial[(chunks + chunk) * cols + c]);
}

__global__ void embedding_kernel(const float* ids, const float* weight, std::size_t n, std::size_t dim,
                                 std::size_t vocab, float* out) {
  for (std::size_t k = blockIdx.x * blockDim.x + threadIdx.x; k < n * dim; k += gridDim.x * blockDim.x) {
    const std::size_t i = k / dim, d = k % dim;
    out[k] = math::valid_index(ids[i], vocab, NAN) ? weight[static_cast<std::size_t>(ids[i]) * dim + d] : 0.0f;
  }
}

// One thread per column d walks the positions in order, so each sum is added in increasing i, as on
// the CPU, with no atomics: deterministic.
__global__ void sgd_kernel(float* p, const float* g, float* buf, std::size_t n, SgdParams s) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
  {
    float none = 0.0f;  // without momentum there is no buffer
    p[i] = math::sgd_update(p[i], g[i], buf ? buf[i] : none, s.lr, s.momentum, s.weight_decay);
  }
}

// Up to kMultiTensorLaunch tensors in the kernel's parameters (__grid_constant__: read where they lie, a
// tensor picked at run time without copying the table to each thread).
struct AdamLaunch {
  AdamTensor tensors[math::kMultiTensorLaunch];
  math::MultiTensorChunks chunks;
};

__global__ void adam_kernel(const __grid_constant__ AdamLaunch list, AdamParams a) {
  for (std::size_t chunk = blockIdx.x; chunk < list.chunks.first[list.chunks.count]; chunk += gridDim.x) {
    const math::ChunkRange r = math::multi_tensor_range(list.chunks, list.tensors, chunk);
    const AdamTensor& x = list.tensors[r.tensor];
    for (std::size_t i = r.begin + threadIdx.x; i < r.end; i += blockDim.x) {
      x.param[i] = math::adam_update(x.param[i], x.grad[i], x.m[i], x.v[i], a.lr, a.beta1, a.beta2, a.eps,
                                     x.weight_decay, a.decoupled_weight_decay, a.bias_correction1,
                                     a.bias_correction2);
      if (a.zero_grad) x.grad[i] = 0.0f;
    }
  }
}

__global__ void arange_kernel(float* out, std::size_t n) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    out[i] = static_cast<float>(i);
}

__global__ void dropout_kernel(const float* in, float* out, std::size_t n, float p, std::uint64_t seed,
                               std::uint64_t first) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    out[i] = rn::mul(in[i], math::dropout_keep(seed, first + i, p));
}

// Clipping's sum of squares, tiled as squares_tiled (kernels.h) models it on the CPU: kSquaresBlocks blocks
// each sum a fixed share and fold it by a fixed tree; then one thread adds the blocks' sums to the total in
// block order. The CPU's bits, every run.
__global__ void squares_kernel(const float* in, std::size_t n, double* partial) {
  __shared__ double share[kSquaresThreads];
  double total = 0.0;
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    const auto x = static_cast<double>(in[i]);
    total = rn::add(total, rn::mul(x, x));
  }
  share[threadIdx.x] = total;
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) share[threadIdx.x] = rn::add(share[threadIdx.x], share[threadIdx.x + stride]);
    __syncthreads();
  }
  if (threadIdx.x == 0) partial[blockIdx.x] = share[0];
}

__global__ void squares_total_kernel(const double* partial, int blocks, double* total) {
  double sum = *total;
  for (int b = 0; b < blocks; ++b) sum = rn::add(sum, partial[b]);
  *total = sum;
}

__global__ void clip_coefficient_kernel(const double* total, double max_norm, float* norm, float* factor) {
  const auto value = static_cast<float>(rn::sqrt(*total));
  *norm = value;
  *factor = math::clip_coefficient(value, max_norm);
}

// A factor of 1 in place changes nothing: the kernel returns at once (clipping that did not clip).
__global__ void scale_by_kernel(const float* in, const float* factor, float* out, std::size_t n) {
  const float f = *factor;
  if (f == 1.0f && in == out) return;
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    out[i] = rn::mul(in[i], f);
}

// The first failed check is kept (a later one finds the record taken); the record is in mapped host memory.
__device__ void record_failed_check(IndexCheckRecord* record, IndexCheck check, float value, std::size_t limit) {
  volatile IndexCheckRecord* r = record;
  if (r->check != static_cast<int>(IndexCheck::none)) return;
  r->value = value;
  r->limit = limit;
  __threadfence_system();
  r->check = static_cast<int>(check);
}

__global__ void check_indices_kernel(IndexCheck check, const float* ids, std::size_t n, std::size_t limit,
                                     float ignore_index, IndexCheckRecord* record) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    if (!math::valid_index(ids[i], limit, ignore_index)) record_failed_check(record, check, ids[i], limit);
}

// One block counts the kept targets (integers: the order cannot matter), thread 0 divides.
__global__ void inverse_count_kernel(const float* targets, std::size_t n, float ignore_index, float* inverse,
                                     IndexCheckRecord* record) {
  __shared__ unsigned long long share[kReduceThreads];
  unsigned long long kept = 0;
  for (std::size_t i = threadIdx.x; i < n; i += blockDim.x) kept += targets[i] != ignore_index;
  share[threadIdx.x] = kept;
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) share[threadIdx.x] += share[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x != 0) return;
  if (share[0] == 0) record_failed_check(record, IndexCheck::every_target_ignored, 0.0f, 0);
  *inverse = share[0] ? rn::div(1.0f, static_cast<float>(share[0])) : 0.0f;
}

// Ring attention's blocks (kernels.h, AttentionBlockShape): one thread per (sequence, head, row), the
// scores computed on the fly. Plain and slow beside a tiled FlashAttention kernel, but each row's sums
// run in the CPU reference's order of keys, and nothing of size queries x keys is ever stored.
__device__ inline float block_score(const float* q, const float* k, std::int64_t hs, float scale) {
  float s = 0.0f;
  for (std::int64_t d = 0; d < hs; ++d) s += q[d] * k[d];
  return s * scale;
}

__global__ void attention_block_kernel(const float* q, const float* k, const float* v, const float* q_pos,
                                       const float* k_pos, AttentionBlockShape s, float* row_max, float* row_sum,
                                       float* out) {
  const std::int64_t tq = s.queries, tk = s.keys, hs = s.head_size, c = s.heads * hs, rows = s.batch * s.heads * tq;
  const float scale = rsqrtf(static_cast<float>(hs));
  for (std::int64_t r = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; r < rows;
       r += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t bh = r / tq, i = r % tq, b = bh / s.heads, h = bh % s.heads;
    const float* qi = q + b * tq * c + i * c + h * hs;
    float* o = out + b * tq * c + i * c + h * hs;
    float top = row_max[r];
    for (std::int64_t j = 0; j < tk; ++j)
      if (!s.causal || k_pos[j] <= q_pos[i]) top = fmaxf(top, block_score(qi, k + b * tk * c + j * c + h * hs, hs, scale));
    if (top == -INFINITY) continue;
    const float correction = row_max[r] == -INFINITY ? 0.0f : math::exp_f32(row_max[r] - top);
    float l = row_sum[r] * correction;
    for (std::int64_t d = 0; d < hs; ++d) o[d] *= correction;
    for (std::int64_t j = 0; j < tk; ++j) {
      if (s.causal && k_pos[j] > q_pos[i]) continue;
      const float p = math::exp_f32(block_score(qi, k + b * tk * c + j * c + h * hs, hs, scale) - top);
      l += p;
      const float* vj = v + b * tk * c + j * c + h * hs;
      for (std::int64_t d = 0; d < hs; ++d) o[d] += p * vj[d];
    }
    row_max[r] = top;
    row_sum[r] = l;
  }
}

__global__ void attention_block_finish_kernel(const float* row_max, const float* row_sum, AttentionBlockShape s,
                                              float* out, float* lse) {
  const std::int64_t tq = s.queries, hs = s.head_size, c = s.heads * hs, rows = s.batch * s.heads * tq;
  for (std::int64_t r = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; r < rows;
       r += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t bh = r / tq, i = r % tq, b = bh / s.heads, h = bh % s.heads;
    const float l = row_sum[r], inverse = l > 0.0f ? 1.0f / l : 0.0f;
    float* o = out + b * tq * c + i * c + h * hs;
    for (std::int64_t d = 0; d < hs; ++d) o[d] *= inverse;
    lse[r] = l > 0.0f ? row_max[r] + logf(l) : INFINITY;
  }
}

// dq, one thread per query row.
__global__ void attention_block_grad_q_kernel(const float* q, const float* k, const float* v, const float* q_pos,
                                              const float* k_pos, const float* out, const float* lse,
                                              const float* grad_out, AttentionBlockShape s, float* grad_q) {
  const std::int64_t tq = s.queries, tk = s.keys, hs = s.head_size, c = s.heads * hs, rows = s.batch * s.heads * tq;
  const float scale = rsqrtf(static_cast<float>(hs));
  for (std::int64_t r = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; r < rows;
       r += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t bh = r / tq, i = r % tq, b = bh / s.heads, h = bh % s.heads, at = b * tq * c + i * c + h * hs;
    float delta = 0.0f;
    for (std::int64_t d = 0; d < hs; ++d) delta += grad_out[at + d] * out[at + d];
    for (std::int64_t j = 0; j < tk; ++j) {
      if (s.causal && k_pos[j] > q_pos[i]) continue;
      const std::int64_t kv = b * tk * c + j * c + h * hs;
      const float p = math::exp_f32(block_score(q + at, k + kv, hs, scale) - lse[r]);
      const float ds = p * (block_score(grad_out + at, v + kv, hs, 1.0f) - delta) * scale;
      for (std::int64_t d = 0; d < hs; ++d) grad_q[at + d] += ds * k[kv + d];
    }
  }
}

// dk and dv, one thread per key row.
__global__ void attention_block_grad_kv_kernel(const float* q, const float* k, const float* v, const float* q_pos,
                                               const float* k_pos, const float* out, const float* lse,
                                               const float* grad_out, AttentionBlockShape s, float* grad_k,
                                               float* grad_v) {
  const std::int64_t tq = s.queries, tk = s.keys, hs = s.head_size, c = s.heads * hs, rows = s.batch * s.heads * tk;
  const float scale = rsqrtf(static_cast<float>(hs));
  for (std::int64_t r = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; r < rows;
       r += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t bh = r / tk, j = r % tk, b = bh / s.heads, h = bh % s.heads, kv = b * tk * c + j * c + h * hs;
    for (std::int64_t i = 0; i < tq; ++i) {
      if (s.causal && k_pos[j] > q_pos[i]) continue;
      const std::int64_t at = b * tq * c + i * c + h * hs;
      float delta = 0.0f;
      for (std::int64_t d = 0; d < hs; ++d) delta += grad_out[at + d] * out[at + d];
      const float p = math::exp_f32(block_score(q + at, k + kv, hs, scale) - lse[bh * tq + i]);
      const float ds = p * (block_score(grad_out + at, v + kv, hs, 1.0f) - delta) * scale;
      for (std::int64_t d = 0; d < hs; ++d) {
        grad_v[kv + d] += p * grad_out[at + d];
        grad_k[kv + d] += ds * q[at + d];
      }
    }
  }
}

// ---- launchers ----------------------------------------------------------------------------------

unsigned blocks_for(std::size_t n, int threads = kThreads) {
  std::size_t blocks = (n + threads - 1) / threads;
  return static_cast<unsigned>(blocks < 65535 ? (blocks == 0 ? 1 : blocks) : 65535);  // grid-stride covers the rest
}

// A two-stage column sum's first grid: blocks of columns along x, chunks of rows along y (each capped;
// the kernels stride over the rest).
dim3 column_grid(std::size_t cols, std::size_t chunks) {
  return dim3(blocks_for(cols), static_cast<unsigned>(chunks < 65535 ? chunks : 65535));
}

void check_launch() { COURSE_CUDA_CHECK(cudaGetLastError()); }

cublasMath_t float32_math() { return allow_tf32() ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_PEDANTIC_MATH; }

cublasHandle_t cublas_handle() {
  static std::mutex mutex;
  static cublasHandle_t handles[64] = {};
  int device = 0;
  COURSE_CUDA_CHECK(cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(mutex);
  if (!handles[device]) COURSE_CUBLAS_CHECK(cublas::functions().create(&handles[device]));
  // Plain FP32, so GPU results stay comparable with the CPU reference, unless TF32 is allowed
  // (set_allow_tf32, --tf32); set at every call, as the setting may change between them.
  COURSE_CUBLAS_CHECK(cublas::functions().set_math_mode(handles[device], float32_math()));
  return handles[device];
}

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
BroadcastIndex strided(std::initializer_list<std::pair<std::int64_t, std::int64_t>> dims) {
  BroadcastIndex ix;
  for (const auto& [size, stride] : dims) {
    ix.dims[ix.rank] = size;
    ix.a_strides[ix.rank++] = stride;
  }
  return ix;
}

// The attention's layouts: the packed projection [B, T, 3, H, hs], the heads apart [3, B, H, T, hs] (each
// head's matrices contiguous, for strided-batched GEMMs), the output [B, T, H, hs].
BroadcastIndex packed_to_heads(const AttentionShape& s) {
  const std::int64_t c = s.heads * s.head_size;
  return strided({{3, c}, {s.batch, s.tokens * 3 * c}, {s.heads, s.head_size}, {s.tokens, 3 * c}, {s.head_size, 1}});
}
BroadcastIndex heads_to_packed(const AttentionShape& s) {
  const std::int64_t n = s.batch * s.heads * s.tokens * s.head_size;
  return strided({{s.batch, s.heads * s.tokens * s.head_size}, {s.tokens, s.head_size}, {3, n},
                  {s.heads, s.tokens * s.head_size}, {s.head_size, 1}});
}
BroadcastIndex heads_to_tokens(const AttentionShape& s) {
  return strided({{s.batch, s.heads * s.tokens * s.head_size}, {s.tokens, s.head_size},
                  {s.heads, s.tokens * s.head_size}, {s.head_size, 1}});
}
BroadcastIndex tokens_to_heads(const AttentionShape& s) {
  const std::int64_t c = s.heads * s.head_size;
  return strided({{s.batch, s.tokens * c}, {s.heads, s.head_size}, {s.tokens, c}, {s.head_size, 1}});
}

class CudaKernels final : public Kernels {
  // out = p times the dropout mask of attention's probabilities (0, or 1/(1 - p) where kept), drawn on the
  // device from (seed, index in the whole batch's probabilities) as the CPU draws it; returns out.
  float* apply_dropout_mask(const float* p, const AttentionShape& s, float* out) {
    const auto n = static_cast<std::size_t>(s.batch * s.heads * s.tokens * s.tokens);
    const auto first = static_cast<std::uint64_t>(s.first_sequence * s.heads * s.tokens * s.tokens);  // a slice's place
    dropout(p, out, n, s.dropout, s.seed, first);
    return out;
  }

  IndexCheckRecord* check_record() { return static_cast<IndexCheckRecord*>(cuda::index_check_record_device()); }

 public:
  void fill(float* out, std::size_t n, float value) override {
    if (!n) return;
    fill_kernel<<<blocks_for(n), kThreads>>>(out, n, value);
    check_launch();
  }
  void fill_bits(std::uint16_t* out, std::size_t n, std::uint16_t bits) override {
    if (!n) return;
    fill_bits_kernel<<<blocks_for(n), kThreads>>>(out, n, bits);
    check_launch();
  }
  void copy(float* out, const float* in, std::size_t n) override {
    if (n) COURSE_CUDA_CHECK(cudaMemcpy(out, in, n * sizeof(float), cudaMemcpyDeviceToDevice));
  }

  // cuBLAS is column-major: a row-major C = op(A) op(B) is the column-major C^T = op(B)^T op(A)^T.
  void gemm(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const float* a,
            const float* b, float beta, float* c) override {
    if (m == 0 || n == 0) return;
    if (k == 0) {
      if (beta == 0.0f) fill(c, static_cast<std::size_t>(m * n), 0.0f);
      else scale(c, beta, c, static_cast<std::size_t>(m * n));
      return;
    }
    COURSE_CUBLAS_CHECK(cublas::functions().sgemm(cublas_handle(), tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                                    static_cast<int>(n), static_cast<int>(m), static_cast<int>(k), &alpha, b,
                                    static_cast<int>(tb ? k : n), a, static_cast<int>(ta ? m : k), &beta, c,
                                    static_cast<int>(n)));
  }

  void gemm_batched(bool ta, bool tb, std::int64_t batch, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
                    const float* a, std::int64_t sa, const float* b, std::int64_t sb, float beta, float* c,
                    std::int64_t sc) override {
    if (batch == 0 || m == 0 || n == 0) return;
    if (k == 0) {
      for (std::int64_t i = 0; i < batch; ++i) gemm(ta, tb, m, n, k, alpha, a, b, beta, c + i * sc);
      return;
    }
    // Column-major, as in gemm: each C^T = op(B)^T op(A)^T.
    COURSE_CUBLAS_CHECK(cublas::functions().sgemm_strided_batched(
        cublas_handle(), tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, static_cast<int>(n),
        static_cast<int>(m), static_cast<int>(k), &alpha, b, static_cast<int>(tb ? k : n), sb, a,
        static_cast<int>(ta ? m : k), sa, &beta, c, static_cast<int>(n), sc, static_cast<int>(batch)));
  }
  // 16-bit operands, float32 accumulation (CUBLAS_COMPUTE_32F) on tensor cores: the handle's pedantic
  // math mode, which keeps the float32 GEMMs off TF32, is lifted for these calls, whose inputs are
  // 16-bit already.
  void gemm_batched_half(HalfFormat format, bool ta, bool tb, std::int64_t batch, std::int64_t m, std::int64_t n,
                         std::int64_t k, float alpha, const std::uint16_t* a, std::int64_t sa, const std::uint16_t* b,
                         std::int64_t sb, float beta, std::uint16_t* c, std::int64_t sc) override {
    if (batch == 0 || m == 0 || n == 0) return;
    if (k == 0) {  // no products: C = beta C, through float32
      DeviceBuffer wide(static_cast<std::size_t>(m * n));
      for (std::int64_t i = 0; i < batch; ++i) {
        from_half(format, c + i * sc, wide.get(), static_cast<std::size_t>(m * n));
        scale(wide.get(), beta, wide.get(), static_cast<std::size_t>(m * n));
        to_half(format, wide.get(), c + i * sc, static_cast<std::size_t>(m * n));
      }
      return;
    }
    const cudaDataType type = format == HalfFormat::bfloat16 ? CUDA_R_16BF : CUDA_R_16F;
    cublasHandle_t handle = cublas_handle();
    COURSE_CUBLAS_CHECK(cublas::functions().set_math_mode(handle, CUBLAS_DEFAULT_MATH));
    // Column-major, as in gemm: each C^T = op(B)^T op(A)^T.
    const cublasStatus_t status = cublas::functions().gemm_strided_batched_ex(
        handle, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, static_cast<int>(n),
        static_cast<int>(m), static_cast<int>(k), &alpha, b, type, static_cast<int>(tb ? k : n), sb, a, type,
        static_cast<int>(ta ? m : k), sa, &beta, c, type, static_cast<int>(n), sc, static_cast<int>(batch),
        CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    COURSE_CUBLAS_CHECK(cublas::functions().set_math_mode(handle, float32_math()));
    COURSE_CUBLAS_CHECK(status);
  }

  void binary(BinaryOp op, const float* a, std::size_t an, const float* b, std::size_t bn, float* out,
              std::size_t n) override {
    if (!n) return;
    binary_kernel<<<blocks_for(n), kThreads>>>(op, a, an, b, bn, out, n);
    check_launch();
  }
  void binary_broadcast(BinaryOp op, const float* a, const float* b, float* out, const BroadcastIndex& ix) override {
    std::int64_t n = 1;
    for (int d = 0; d < ix.rank; ++d) n *= ix.dims[d];
    if (!n) return;
    binary_broadcast_kernel<<<blocks_for(static_cast<std::size_t>(n)), kThreads>>>(op, a, b, out, ix, n);
    check_launch();
  }
  void gather(const float* in, float* out, const BroadcastIndex& ix) override {
    std::int64_t n = 1;
    for (int d = 0; d < ix.rank; ++d) n *= ix.dims[d];
    if (!n) return;
    gather_kernel<<<blocks_for(static_cast<std::size_t>(n)), kThreads>>>(in, out, ix, n);
    check_launch();
  }
  void sum_to(const float* in, float* out, std::size_t out_n, const BroadcastIndex& ix) override {
    if (!out_n) return;
    sum_to_kernel<<<blocks_for(out_n), kThreads>>>(in, out, out_n, ix);
    check_launch();
  }
  void scale(const float* in, float factor, float* out, std::size_t n) override {
    if (!n) return;
    scale_kernel<<<blocks_for(n), kThreads>>>(in, factor, out, n);
    check_launch();
  }
  void to_half(HalfFormat format, const float* in, std::uint16_t* out, std::size_t n) override {
    if (!n) return;
    to_half_kernel<<<blocks_for(n), kThreads>>>(format, in, out, n);
    check_launch();
  }
  void from_half(HalfFormat format, const std::uint16_t* in, float* out, std::size_t n) override {
    if (!n) return;
    from_half_kernel<<<blocks_for(n), kThreads>>>(format, in, out, n);
    check_launch();
  }
  void binary_half(HalfFormat format, BinaryOp op, const std::uint16_t* a, std::size_t an, const std::uint16_t* b,
                   std::size_t bn, std::uint16_t* out, std::size_t n) override {
    if (!n) return;
    half::with_format(format, [&](auto f) {
      binary_half_kernel<decltype(f)::value><<<blocks_for(n), kThreads>>>(op, a, an, b, bn, out, n);
    });
    check_launch();
  }
  void unary_half(HalfFormat format, UnaryOp op, const std::uint16_t* in, std::uint16_t* out, std::size_t n) override {
    if (!n) return;
    half::with_format(format, [&](auto f) { unary_half_kernel<decltype(f)::value><<<blocks_for(n), kThreads>>>(op, in, out, n); });
    check_launch();
  }
  void unary_backward_half(HalfFormat format, UnaryOp op, const std::uint16_t* in, const std::uint16_t* g,
                           std::uint16_t* out, std::size_t n) override {
    if (!n) return;
    half::with_format(format, [&](auto f) {
      unary_backward_half_kernel<decltype(f)::value><<<blocks_for(n), kThreads>>>(op, in, g, out, n);
    });
    check_launch();
  }
  void add_half(HalfFormat format, const std::uint16_t* in, float* acc, std::size_t n) override {
    if (!n) return;
    half::with_format(format, [&](auto f) { add_half_kernel<decltype(f)::value><<<blocks_for(n), kThreads>>>(in, acc, n); });
    check_launch();
  }
  void sum(const float* in, std::size_t n, float* out) override {
    sum_kernel<<<1, kReduceThreads>>>(in, n, out);
    check_launch();
  }
  void sum_rows(const float* in, std::size_t rows, std::size_t cols, float* out) override {
    if (!cols) return;
    const std::size_t chunks = math::column_chunks(rows);
    DeviceBuffer partial(2 * chunks * cols);  // [chunks, cols] doubles
    auto* sums = reinterpret_cast<double*>(partial.get());
    if (chunks) {
      sum_rows_chunks_kernel<<<column_grid(cols, chunks), kThreads>>>(in, rows, cols, sums);
      check_launch();
    }
    column_totals_kernel<<<blocks_for(cols), kThreads>>>(sums, chunks, cols, out);
    check_launch();
  }
  void unary(UnaryOp op, const float* in, float* out, std::size_t n) override {
    if (!n) return;
    unary_kernel<<<blocks_for(n), kThreads>>>(op, in, out, n);
    check_launch();
  }
  void unary_backward(UnaryOp op, const float* in, const float* g, float* out, std::size_t n) override {
    if (!n) return;
    unary_backward_kernel<<<blocks_for(n), kThreads>>>(op, in, g, out, n);
    check_launch();
  }
  void softmax(const float* in, std::size_t rows, std::size_t cols, bool causal, float* out) override {
    if (!rows || !cols) return;
    softmax_kernel<<<blocks_for(rows), kThreads>>>(in, rows, cols, causal, out);
    check_launch();
  }
  void softmax_backward(const float* y, const float* g, std::size_t rows, std::size_t cols, float* dx) override {
    if (!rows || !cols) return;
    softmax_backward_kernel<<<blocks_for(rows), kThreads>>>(y, g, rows, cols, dx);
    check_launch();
  }
  // Attention from the library's own pieces: the heads gathered apart, cuBLAS's strided-batched GEMMs over
  // every (sequence, head), the CPU's softmax rows in lanes, the output gathered back into [B, T, C].
  void attention(const float* qkv, const AttentionShape& s, float* probs, float* y) override {
    const std::int64_t bh = s.batch * s.heads, t = s.tokens, hs = s.head_size, n = bh * t * hs;
    if (!n) return;
    DeviceBuffer heads(static_cast<std::size_t>(3 * n)), out(static_cast<std::size_t>(n));
    const float *q = heads.get(), *k = q + n, *v = q + 2 * n;
    gather(qkv, heads.get(), packed_to_heads(s));
    gemm_batched(false, true, bh, t, t, hs, 1.0f / std::sqrt(static_cast<float>(hs)), q, t * hs, k, t * hs, 0.0f,
                 probs, t * t);
    const auto rows = static_cast<std::size_t>(bh * t);
    attention_softmax_kernel<<<blocks_for(rows * math::kLanes), kThreads>>>(probs, rows, static_cast<std::size_t>(t), s.causal);
    check_launch();
    DeviceBuffer dropped(s.dropout > 0.0f ? static_cast<std::size_t>(bh * t * t) : 0);
    const float* weights = s.dropout > 0.0f ? apply_dropout_mask(probs, s, dropped.get()) : probs;
    gemm_batched(false, false, bh, t, hs, t, 1.0f, weights, t * t, v, t * hs, 0.0f, out.get(), t * hs);
    gather(out.get(), y, heads_to_tokens(s));
  }
  void flash_attention(const float* qkv, const AttentionShape& s, float* lse, float* y) override {
    cuda_flash::forward(qkv, s, lse, y);
  }
  void flash_attention_backward(const float* qkv, const float* y, const float* lse, const float* grad_y,
                                const AttentionShape& s, float* grad_qkv) override {
    DeviceBuffer delta(static_cast<std::size_t>(s.batch * s.heads * s.tokens));
    cuda_flash::backward(qkv, y, lse, grad_y, s, delta.get(), grad_qkv);
  }
  void flash_attention_half(HalfFormat format, const std::uint16_t* qkv, const AttentionShape& s, float* lse,
                            std::uint16_t* y) override {
    cuda_flash::forward_half(format, qkv, s, lse, y);
  }
  void flash_attention_backward_half(HalfFormat format, const std::uint16_t* qkv, const std::uint16_t* y,
                                     const float* lse, const std::uint16_t* grad_y, const AttentionShape& s,
                                     std::uint16_t* grad_qkv) override {
    DeviceBuffer delta(static_cast<std::size_t>(s.batch * s.heads * s.tokens));
    cuda_flash::backward_half(format, qkv, y, lse, grad_y, s, delta.get(), grad_qkv);
  }
  void attention_block(const float* q, const float* k, const float* v, const float* q_pos, const float* k_pos,
                       const AttentionBlockShape& s, float* row_max, float* row_sum, float* out) override {
    const auto rows = static_cast<std::size_t>(s.batch * s.heads * s.queries);
    if (!rows || !s.keys) return;
    attention_block_kernel<<<blocks_for(rows), kThreads>>>(q, k, v, q_pos, k_pos, s, row_max, row_sum, out);
    check_launch();
  }
  void attention_block_finish(const float* row_max, const float* row_sum, const AttentionBlockShape& s, float* out,
                              float* lse) override {
    const auto rows = static_cast<std::size_t>(s.batch * s.heads * s.queries);
    if (!rows) return;
    attention_block_finish_kernel<<<blocks_for(rows), kThreads>>>(row_max, row_sum, s, out, lse);
    check_launch();
  }
  void attention_block_backward(const float* q, const float* k, const float* v, const float* q_pos, const float* k_pos,
                                const float* out, const float* lse, const float* grad_out, const AttentionBlockShape& s,
                                float* grad_q, float* grad_k, float* grad_v) override {
    const auto queries = static_cast<std::size_t>(s.batch * s.heads * s.queries), keys = static_cast<std::size_t>(s.batch * s.heads * s.keys);
    if (!queries || !keys) return;
    attention_block_grad_q_kernel<<<blocks_for(queries), kThreads>>>(q, k, v, q_pos, k_pos, out, lse, grad_out, s, grad_q);
    check_launch();
    attention_block_grad_kv_kernel<<<blocks_for(keys), kThreads>>>(q, k, v, q_pos, k_pos, out, lse, grad_out, s, grad_k,
                                                                   grad_v);
    check_launch();
  }
  void attention_backward(const float* qkv, const float* probs, const float* grad_y, const AttentionShape& s,
                          float* grad_qkv) override {
    const std::int64_t bh = s.batch * s.heads, t = s.tokens, hs = s.head_size, n = bh * t * hs;
    if (!n) return;
    DeviceBuffer heads(static_cast<std::size_t>(3 * n)), dy(static_cast<std::size_t>(n));
    DeviceBuffer grads(static_cast<std::size_t>(3 * n)), dp(static_cast<std::size_t>(bh * t * t));
    const float *q = heads.get(), *k = q + n, *v = q + 2 * n;
    float *dq = grads.get(), *dk = dq + n, *dv = dq + 2 * n;
    gather(qkv, heads.get(), packed_to_heads(s));
    gather(grad_y, dy.get(), tokens_to_heads(s));
    DeviceBuffer dropped(s.dropout > 0.0f ? static_cast<std::size_t>(bh * t * t) : 0);
    const float* weights = s.dropout > 0.0f ? apply_dropout_mask(probs, s, dropped.get()) : probs;
    gemm_batched(true, false, bh, t, hs, t, 1.0f, weights, t * t, dy.get(), t * hs, 0.0f, dv, t * hs);  // p^T dy
    gemm_batched(false, true, bh, t, t, hs, 1.0f, dy.get(), t * hs, v, t * hs, 0.0f, dp.get(), t * t);  // dy v^T
    if (s.dropout > 0.0f) apply_dropout_mask(dp.get(), s, dp.get());
    const auto rows = static_cast<std::size_t>(bh * t);  // ds, the scale 1/sqrt(hs) inside, as on the CPU
    attention_softmax_backward_kernel<<<blocks_for(rows * math::kLanes), kThreads>>>(
        probs, dp.get(), rows, static_cast<std::size_t>(t), s.causal, 1.0f / std::sqrt(static_cast<float>(hs)));
    check_launch();
    gemm_batched(false, false, bh, t, hs, t, 1.0f, dp.get(), t * t, k, t * hs, 0.0f, dq, t * hs);  // ds k
    gemm_batched(true, false, bh, t, hs, t, 1.0f, dp.get(), t * t, q, t * hs, 0.0f, dk, t * hs);   // ds^T q
    gather(grads.get(), grad_qkv, heads_to_packed(s));
  }

  void layer_norm(const float* x, const float* w, const float* b, std::size_t rows, std::size_t cols, float eps,
                  float* out, float* mean, float* rstd) override {
    if (!rows) return;
    layer_norm_kernel<<<blocks_for(rows * math::kLanes), kThreads>>>(x, w, b, rows, cols, eps, out, mean, rstd);
    check_launch();
  }
  void layer_norm_backward(const float* x, const float* w, const float* mean, const float* rstd, const float* g,
                           std::size_t rows, std::size_t cols, float* dx, float* dw, float* db) override {
    if (rows) {
      layer_norm_backward_x_kernel<<<blocks_for(rows * math::kLanes), kThreads>>>(x, w, mean, rstd, g, rows, cols, dx);
      check_launch();
    }
    if (cols) {
      const std::size_t chunks = math::column_chunks(rows);
      DeviceBuffer partial(4 * chunks * cols);  // [2, chunks, cols] doubles
      auto* sums = reinterpret_cast<double*>(partial.get());
      if (chunks) {
        layer_norm_params_chunks_kernel<<<column_grid(cols, chunks), kThreads>>>(x, mean, rstd, g, rows, cols, sums);
        check_launch();
      }
      column_totals_kernel<<<blocks_for(cols), kThreads>>>(sums, chunks, cols, dw);
      check_launch();
      column_totals_kernel<<<blocks_for(cols), kThreads>>>(sums + chunks * cols, chunks, cols, db);
      check_launch();
    }
  }
  void embedding(const float* ids, const float* weight, std::size_t n, std::size_t dim, std::size_t vocab,
                 float* out) override {
    if (!n || !dim) return;
    embedding_kernel<<<blocks_for(n * dim), kThreads>>>(ids, weight, n, dim, vocab, out);
    check_launch();
  }
  void embedding_backward(const float* ids, const float* g, std::size_t n, std::size_t dim, std::size_t vocab,
                          float* dw) override {
    cuda_embedding::backward(ids, g, n, dim, vocab, dw);
  }
  void cross_entropy(const float* logits, const float* targets, std::size_t rows, std::size_t cols,
                     float* losses) override {
    if (!rows) return;
    cross_entropy_kernel<<<blocks_for(rows * math::kLanes), kThreads>>>(logits, targets, rows, cols, losses);
    check_launch();
  }
  void cross_entropy_backward(const float* logits, const float* targets, const float* g, std::size_t rows,
                              std::size_t cols, float* out) override {
    if (!rows) return;
    cross_entropy_backward_kernel<<<blocks_for(rows * math::kLanes), kThreads>>>(logits, targets, g, rows, cols, out);
    check_launch();
  }
  void cross_entropy_half(HalfFormat format, const std::uint16_t* logits, const float* targets, std::size_t rows,
                          std::size_t cols, float* losses, float* top, double* total) override {
    if (!rows) return;
    half::with_format(format, [&](auto f) {
      cross_entropy_half_kernel<decltype(f)::value><<<blocks_for(rows * math::kLanes), kThreads>>>(
          logits, targets, rows, cols, losses, top, total);
    });
    check_launch();
  }
  void cross_entropy_backward_half(HalfFormat format, const std::uint16_t* logits, const float* targets, const float* g,
                                   const float* top, const double* total, std::size_t rows, std::size_t cols,
                                   std::uint16_t* out) override {
    if (!rows) return;
    half::with_format(format, [&](auto f) {
      cross_entropy_backward_half_kernel<decltype(f)::value><<<blocks_for(rows * math::kLanes), kThreads>>>(
          logits, targets, g, top, total, rows, cols, out);
    });
    check_launch();
  }
  void arange(float* out, std::size_t n) override {
    if (!n) return;
    arange_kernel<<<blocks_for(n), kThreads>>>(out, n);
    check_launch();
  }
  void dropout(const float* in, float* out, std::size_t n, float p, std::uint64_t seed, std::uint64_t first) override {
    if (!n) return;
    dropout_kernel<<<blocks_for(n), kThreads>>>(in, out, n, p, seed, first);
    check_launch();
  }
  void add_squares(const float* in, std::size_t n, double* total) override {
    if (!n) return;
    DeviceBuffer partial(2 * kSquaresBlocks);  // kSquaresBlocks doubles
    auto* sums = reinterpret_cast<double*>(partial.get());
    squares_kernel<<<kSquaresBlocks, kSquaresThreads>>>(in, n, sums);
    check_launch();
    squares_total_kernel<<<1, 1>>>(sums, kSquaresBlocks, total);
    check_launch();
  }
  void clip_coefficient(const double* total, double max_norm, float* norm, float* factor) override {
    clip_coefficient_kernel<<<1, 1>>>(total, max_norm, norm, factor);
    check_launch();
  }
  void scale_by(const float* in, const float* factor, float* out, std::size_t n) override {
    if (!n) return;
    scale_by_kernel<<<blocks_for(n), kThreads>>>(in, factor, out, n);
    check_launch();
  }
  void check_indices(IndexCheck check, const float* ids, std::size_t n, std::size_t limit, float ignore_index) override {
    if (!n) return;
    check_indices_kernel<<<blocks_for(n), kThreads>>>(check, ids, n, limit, ignore_index, check_record());
    check_launch();
  }
  void inverse_count(const float* targets, std::size_t n, float ignore_index, float* inverse) override {
    inverse_count_kernel<<<1, kReduceThreads>>>(targets, n, ignore_index, inverse, check_record());
    check_launch();
  }
  void sgd_step(float* p, const float* g, float* buf, std::size_t n, const SgdParams& s) override {
    if (!n) return;
    sgd_kernel<<<blocks_for(n), kThreads>>>(p, g, buf, n, s);
    check_launch();
  }
  void adam_step(const std::vector<AdamTensor>& list, const AdamParams& a) override {
    math::for_each_multi_tensor_launch(list, [&](const AdamTensor* tensors, int count, const math::MultiTensorChunks& chunks) {
      const std::size_t total = chunks.first[count];
      if (!total) return;
      AdamLaunch launch;
      std::copy(tensors, tensors + count, launch.tensors);
      launch.chunks = chunks;
      adam_kernel<<<static_cast<unsigned>(std::min<std::size_t>(total, 1u << 20)), kThreads>>>(launch, a);
      check_launch();
    });
  }
};

}  // namespace

Kernels& cuda_kernels() {
  static CudaKernels instance;
  return instance;
}

}  // namespace course
