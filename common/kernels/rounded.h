// Explicitly rounded arithmetic for the formulas the CPU and CUDA kernels share (math.h): each operation
// rounds once to nearest even and is never fused with another, so both devices compute the same bits.
//
// Why: a compiler may contract a * b + c into one fused multiply-add (FMA), which skips the product's
// rounding. nvcc does so by default in device code, and a host compiler may where the target has FMA
// (x86-64-v3, the CPU kernels' AVX2 clones). One contraction on one device and not on the other is one
// unit in the last place apart, and a lock-step check that compares the two bit for bit then fails (a
// ZeRO-Offload run's host AdamW against the reference's device AdamW did, at step 0). So:
// - on the device these are CUDA's round-to-nearest intrinsics (__fmul_rn, __fadd_rn, ...), which the
//   compiler never contracts (CUDA C++ Programming Guide, "Floating-Point Standard"; PTX's mul.rn and
//   add.rn, "not contracted");
// - on the host they are the plain operators, in files compiled with -ffp-contract=off (the CPU kernels'
//   files, common/CMakeLists.txt), where every operator rounds alone.
// Division and square root are IEEE's correctly rounded ones on both: the same bits everywhere.
// tests/rounded_ptx_test.cpp reads the shared kernels' PTX for an operation that could be contracted.
#pragma once
#include <cmath>

#ifndef COURSE_HOST_DEVICE
#ifdef __CUDACC__
#define COURSE_HOST_DEVICE __host__ __device__
#else
#define COURSE_HOST_DEVICE
#endif
#endif

namespace course::rn {

#ifdef __CUDA_ARCH__
COURSE_HOST_DEVICE inline float mul(float a, float b) { return __fmul_rn(a, b); }
COURSE_HOST_DEVICE inline float add(float a, float b) { return __fadd_rn(a, b); }
COURSE_HOST_DEVICE inline float sub(float a, float b) { return __fsub_rn(a, b); }
COURSE_HOST_DEVICE inline float div(float a, float b) { return __fdiv_rn(a, b); }
COURSE_HOST_DEVICE inline float sqrt(float a) { return __fsqrt_rn(a); }
COURSE_HOST_DEVICE inline double mul(double a, double b) { return __dmul_rn(a, b); }
COURSE_HOST_DEVICE inline double add(double a, double b) { return __dadd_rn(a, b); }
COURSE_HOST_DEVICE inline double sub(double a, double b) { return __dsub_rn(a, b); }
COURSE_HOST_DEVICE inline double div(double a, double b) { return __ddiv_rn(a, b); }
COURSE_HOST_DEVICE inline double sqrt(double a) { return __dsqrt_rn(a); }
#else
COURSE_HOST_DEVICE inline float mul(float a, float b) { return a * b; }
COURSE_HOST_DEVICE inline float add(float a, float b) { return a + b; }
COURSE_HOST_DEVICE inline float sub(float a, float b) { return a - b; }
COURSE_HOST_DEVICE inline float div(float a, float b) { return a / b; }
COURSE_HOST_DEVICE inline float sqrt(float a) { return std::sqrt(a); }
COURSE_HOST_DEVICE inline double mul(double a, double b) { return a * b; }
COURSE_HOST_DEVICE inline double add(double a, double b) { return a + b; }
COURSE_HOST_DEVICE inline double sub(double a, double b) { return a - b; }
COURSE_HOST_DEVICE inline double div(double a, double b) { return a / b; }
COURSE_HOST_DEVICE inline double sqrt(double a) { return std::sqrt(a); }
#endif

}  // namespace course::rn
