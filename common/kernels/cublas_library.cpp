// cuBLAS opened on first use (cublas_library.h).
#include "common/kernels/cublas_library.h"

#include <dlfcn.h>

#include <atomic>
#include <mutex>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace course::cublas {
namespace {

// The spelled-out type names an overload the header declares (unevaluated: no reference to link).
static_assert(std::is_same_v<decltype(static_cast<GemmStridedBatchedEx>(&::cublasGemmStridedBatchedEx)),
                             GemmStridedBatchedEx>);

std::atomic<bool> g_opened{false};

void* open_library() {
  const std::string soname = "libcublas.so." + std::to_string(CUBLAS_VER_MAJOR);
  std::string reasons;
  for (const std::string& name : {soname, std::string(COURSE_CUDA_LIBRARY_DIR) + "/" + soname}) {
    if (void* library = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL)) return library;
    reasons += std::string(reasons.empty() ? "" : "; ") + dlerror();
  }
  throw std::runtime_error("cuBLAS: cannot open " + soname + " (" + reasons + ")");
}

template <typename Function>
void find(void* library, const char* name, Function& out) {
  out = reinterpret_cast<Function>(dlsym(library, name));
  if (!out) throw std::runtime_error(std::string("cuBLAS: ") + name + " is missing from the library");
}

Functions open_functions() {
  void* library = open_library();  // kept open for the process's life
  Functions f{};
  // The exported names: cublas_v2.h maps cublasCreate and cublasSgemm to their _v2 forms.
  find(library, "cublasCreate_v2", f.create);
  find(library, "cublasSetMathMode", f.set_math_mode);
  find(library, "cublasSgemm_v2", f.sgemm);
  find(library, "cublasSgemmStridedBatched", f.sgemm_strided_batched);
  find(library, "cublasGemmStridedBatchedEx", f.gemm_strided_batched_ex);
  g_opened = true;
  return f;
}

}  // namespace

const Functions& functions() {
  static const Functions f = open_functions();  // thread-safe once; a failure throws again next time
  return f;
}

bool opened() { return g_opened; }

}  // namespace course::cublas
