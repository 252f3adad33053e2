// cuBLAS opened at its first use (common/kernels/cublas_library.h): not open when the process starts,
// then open with every function it is asked for. Needs the library, not a GPU.
#include <gtest/gtest.h>

#if COURSE_HAVE_CUDA
#include "common/kernels/cublas_library.h"
#endif

namespace course::testing {
namespace {

TEST(CublasLibrary, OpensAtTheFirstUseWithEveryFunction) {
#if COURSE_HAVE_CUDA
  EXPECT_FALSE(cublas::opened()) << "cuBLAS was open before anything asked for it";
  const cublas::Functions& f = cublas::functions();
  EXPECT_TRUE(cublas::opened());
  EXPECT_NE(f.create, nullptr);
  EXPECT_NE(f.set_math_mode, nullptr);
  EXPECT_NE(f.sgemm, nullptr);
  EXPECT_NE(f.sgemm_strided_batched, nullptr);
  EXPECT_NE(f.gemm_strided_batched_ex, nullptr);
  EXPECT_EQ(&cublas::functions(), &f);  // opened once
#else
  GTEST_SKIP() << "this build has no CUDA backend: cuBLAS is not part of it";
#endif
}

}  // namespace
}  // namespace course::testing
