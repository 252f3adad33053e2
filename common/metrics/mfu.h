// Model FLOPs utilisation (MFU; Chowdhery et al., "PaLM", 2022, appendix B): the FLOPs a step of the model
// needs, per second, over the device's peak. FLOPs are counted as nanoGPT's estimate_mfu counts them,
// 6 N + 12 L H Q T per token (N the parameters without the position embeddings, L layers, H heads of Q
// channels, T tokens of context: the weights' multiply-adds forward and backward, and attention's), so
// figures compare with nanoGPT's and llm.c's.
#pragma once
#include <cstdint>
#include <string>

#include "common/core/dtype.h"

namespace course::metrics {

struct GptFlopsShape {
  std::int64_t parameters = 0;           // every parameter, the position embeddings included
  std::int64_t position_parameters = 0;  // block_size x n_embd
  std::int64_t n_layer = 0, n_head = 0, n_embd = 0, block_size = 0;
};

// FLOPs per token of one training step (forward and backward).
double gpt_flops_per_token(const GptFlopsShape& shape);

// The dense peak TFLOP/s of a GPU, from its product name (cudaDeviceProp::name) and the GEMMs' type: the
// vendor's datasheet figure without sparsity (bfloat16 and float16 on tensor cores; float32 on the CUDA
// cores, or TF32's tensor cores when `tf32`). 0 when the name is not in the table: pass --peak-tflops.
double peak_tflops(const std::string& gpu_name, DType type, bool tf32);

}  // namespace course::metrics
