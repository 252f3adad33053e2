// CUDA kernels: the same interface as cpu_kernels.cpp, checked against it by the parity tests.
// Reductions use a fixed thread-to-data mapping and a fixed tree, never atomics, so they are
// deterministic: the same inputs give the same bits on every run.
#include <cublas_v2.h>

#include <mutex>

#include "common/core/cuda_check.h"
#include "common/kernels/kernels.h"
#include "common/kernels/half.h"
#include "common/kernels/math.h"

namespace course {
namespace {

// ---- kernels ------------------------------------------------------------------------------------

constexpr int kThreads = 256;
constexpr int kReduceThreads = 1024;

__global__ void fill_kernel(float* out, std::size_t n, float value) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) out[i] = value;
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
    float x = a[an == n ? i : i % an], y = b[bn == n ? i : i % bn];
    out[i] = op == BinaryOp::add ? x + y : op == BinaryOp::sub ? x - y : op == BinaryOp::mul ? x * y : fmaxf(x, y);
  }
}

__global__ void scale_kernel(const float* in, float factor, float* out, std::size_t n) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    out[i] = in[i] * factor;
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

// One thread per column, rows in order: coalesced reads and a fixed order.
__global__ void sum_rows_kernel(const float* in, std::size_t rows, std::size_t cols, float* out) {
  std::size_t j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= cols) return;
  double total = 0.0;
  for (std::size_t i = 0; i < rows; ++i) total += in[i * cols + j];
  out[j] = static_cast<float>(total);
}

__global__ void unary_kernel(UnaryOp op, const float* in, float* out, std::size_t n) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    out[i] = op == UnaryOp::relu ? fmaxf(in[i], 0.0f) : math::gelu(in[i]);
}

__global__ void unary_backward_kernel(UnaryOp op, const float* in, const float* g, float* out, std::size_t n) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    out[i] = op == UnaryOp::relu ? (in[i] > 0.0f ? g[i] : 0.0f) : g[i] * math::gelu_grad(in[i]);
}

__device__ double row_exp_sum(const float* row, std::size_t cols, float top) {
  double total = 0.0;
  for (std::size_t c = 0; c < cols; ++c) total += exp(static_cast<double>(row[c] - top));
  return total;
}
__device__ float row_max(const float* row, std::size_t cols) {
  float top = row[0];
  for (std::size_t c = 1; c < cols; ++c) top = fmaxf(top, row[c]);
  return top;
}

__global__ void cross_entropy_kernel(const float* logits, const float* targets, std::size_t rows, std::size_t cols,
                                     float* losses) {
  std::size_t r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  const float* row = logits + r * cols;
  float top = row_max(row, cols);
  auto target = static_cast<std::size_t>(targets[r]);
  losses[r] = static_cast<float>(log(row_exp_sum(row, cols, top)) + top - row[target]);
}

__global__ void cross_entropy_backward_kernel(const float* logits, const float* targets, const float* g,
                                              std::size_t rows, std::size_t cols, float* out) {
  std::size_t r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  const float* row = logits + r * cols;
  float top = row_max(row, cols);
  double total = row_exp_sum(row, cols, top);
  auto target = static_cast<std::size_t>(targets[r]);
  for (std::size_t c = 0; c < cols; ++c) {
    double softmax = exp(static_cast<double>(row[c] - top)) / total;
    out[r * cols + c] = static_cast<float>((softmax - (c == target ? 1.0 : 0.0)) * g[r]);
  }
}

__global__ void sgd_kernel(float* p, const float* g, float* buf, std::size_t n, SgdParams s) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
  {
    float none = 0.0f;  // without momentum there is no buffer
    p[i] = math::sgd_update(p[i], g[i], buf ? buf[i] : none, s.lr, s.momentum, s.weight_decay);
  }
}

__global__ void adam_kernel(float* p, const float* g, float* m, float* v, std::size_t n, AdamParams a) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    p[i] = math::adam_update(p[i], g[i], m[i], v[i], a.lr, a.beta1, a.beta2, a.eps, a.weight_decay,
                             a.decoupled_weight_decay, a.bias_correction1, a.bias_correction2);
}

// ---- launchers ----------------------------------------------------------------------------------

unsigned blocks_for(std::size_t n, int threads = kThreads) {
  std::size_t blocks = (n + threads - 1) / threads;
  return static_cast<unsigned>(blocks < 65535 ? (blocks == 0 ? 1 : blocks) : 65535);  // grid-stride covers the rest
}

void check_launch() { COURSE_CUDA_CHECK(cudaGetLastError()); }

cublasHandle_t cublas_handle() {
  static std::mutex mutex;
  static cublasHandle_t handles[64] = {};
  int device = 0;
  COURSE_CUDA_CHECK(cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(mutex);
  if (!handles[device]) {
    COURSE_CUBLAS_CHECK(cublasCreate(&handles[device]));
    // Plain FP32 (no TF32), so GPU results stay comparable with the CPU reference.
    COURSE_CUBLAS_CHECK(cublasSetMathMode(handles[device], CUBLAS_PEDANTIC_MATH));
  }
  return handles[device];
}

class CudaKernels final : public Kernels {
 public:
  void fill(float* out, std::size_t n, float value) override {
    if (!n) return;
    fill_kernel<<<blocks_for(n), kThreads>>>(out, n, value);
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
    COURSE_CUBLAS_CHECK(cublasSgemm(cublas_handle(), tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                                    static_cast<int>(n), static_cast<int>(m), static_cast<int>(k), &alpha, b,
                                    static_cast<int>(tb ? k : n), a, static_cast<int>(ta ? m : k), &beta, c,
                                    static_cast<int>(n)));
  }

  void binary(BinaryOp op, const float* a, std::size_t an, const float* b, std::size_t bn, float* out,
              std::size_t n) override {
    if (!n) return;
    binary_kernel<<<blocks_for(n), kThreads>>>(op, a, an, b, bn, out, n);
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
  void sum(const float* in, std::size_t n, float* out) override {
    sum_kernel<<<1, kReduceThreads>>>(in, n, out);
    check_launch();
  }
  void sum_rows(const float* in, std::size_t rows, std::size_t cols, float* out) override {
    if (!cols) return;
    sum_rows_kernel<<<blocks_for(cols), kThreads>>>(in, rows, cols, out);
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
  void cross_entropy(const float* logits, const float* targets, std::size_t rows, std::size_t cols,
                     float* losses) override {
    if (!rows) return;
    cross_entropy_kernel<<<blocks_for(rows), kThreads>>>(logits, targets, rows, cols, losses);
    check_launch();
  }
  void cross_entropy_backward(const float* logits, const float* targets, const float* g, std::size_t rows,
                              std::size_t cols, float* out) override {
    if (!rows) return;
    cross_entropy_backward_kernel<<<blocks_for(rows), kThreads>>>(logits, targets, g, rows, cols, out);
    check_launch();
  }
  void sgd_step(float* p, const float* g, float* buf, std::size_t n, const SgdParams& s) override {
    if (!n) return;
    sgd_kernel<<<blocks_for(n), kThreads>>>(p, g, buf, n, s);
    check_launch();
  }
  void adam_step(float* p, const float* g, float* m, float* v, std::size_t n, const AdamParams& a) override {
    if (!n) return;
    adam_kernel<<<blocks_for(n), kThreads>>>(p, g, m, v, n, a);
    check_launch();
  }
};

}  // namespace

Kernels& cuda_kernels() {
  static CudaKernels instance;
  return instance;
}

}  // namespace course
