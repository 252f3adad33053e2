// Scalar formulas shared by the CPU and CUDA kernels, so both compute the same expression.
#pragma once
#include <cmath>

#ifdef __CUDACC__
#define COURSE_HOST_DEVICE __host__ __device__
#else
#define COURSE_HOST_DEVICE
#endif

namespace course::math {

// GELU, tanh approximation (Hendrycks & Gimpel, "Gaussian Error Linear Units", 2016).
constexpr float kGeluC = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kGeluA = 0.044715f;

COURSE_HOST_DEVICE inline float gelu(float x) {
  float inner = kGeluC * (x + kGeluA * x * x * x);
  return 0.5f * x * (1.0f + tanhf(inner));
}

COURSE_HOST_DEVICE inline float gelu_grad(float x) {
  float inner = kGeluC * (x + kGeluA * x * x * x);
  float t = tanhf(inner);
  float d_inner = kGeluC * (1.0f + 3.0f * kGeluA * x * x);
  return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * d_inner;
}

COURSE_HOST_DEVICE inline float sgd_update(float p, float g, float& buf, float lr, float momentum, float wd) {
  g += wd * p;
  buf = momentum * buf + g;  // buf starts at zero, so the first step uses g itself, as in PyTorch
  return p - lr * buf;
}

COURSE_HOST_DEVICE inline float adam_update(float p, float g, float& m, float& v, float lr, float b1, float b2,
                                            float eps, float wd, bool decoupled, float bc1, float bc2) {
  if (decoupled) p -= lr * wd * p;
  else g += wd * p;
  m = b1 * m + (1.0f - b1) * g;
  v = b2 * v + (1.0f - b2) * g * g;
  float m_hat = m / bc1;
  float v_hat = v / bc2;
  return p - lr * m_hat / (sqrtf(v_hat) + eps);
}

}  // namespace course::math
