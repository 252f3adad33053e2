// FlashAttention-2 on the CPU: the model of the CUDA kernels' tiled algorithm (kernels/flash.h), the CPU
// backend's Kernels::flash_attention and flash_attention_backward.
#pragma once
#include "common/kernels/kernels.h"

namespace course::cpu {

void flash_attention(const float* qkv, const AttentionShape& shape, float* lse, float* y);
void flash_attention_backward(const float* qkv, const float* y, const float* lse, const float* grad_y,
                              const AttentionShape& shape, float* grad_qkv);

}  // namespace course::cpu
