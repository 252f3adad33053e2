// FlashAttention-2's CUDA kernels (kernels/flash.h holds their arithmetic, cpu_flash_attention.cpp their
// CPU model): the CUDA backend's Kernels::flash_attention and flash_attention_backward.
#pragma once
#include "common/kernels/kernels.h"

namespace course::cuda_flash {

void forward(const float* qkv, const AttentionShape& shape, float* lse, float* y);
// delta: scratch of batch x heads x tokens floats, each query row's dy . y.
void backward(const float* qkv, const float* y, const float* lse, const float* grad_y, const AttentionShape& shape,
              float* delta, float* grad_qkv);
// The same on 16-bit tensors in `format`, read and written where they lie (Kernels::flash_attention_half).
void forward_half(HalfFormat format, const std::uint16_t* qkv, const AttentionShape& shape, float* lse, std::uint16_t* y);
void backward_half(HalfFormat format, const std::uint16_t* qkv, const std::uint16_t* y, const float* lse,
                   const std::uint16_t* grad_y, const AttentionShape& shape, float* delta, std::uint16_t* grad_qkv);

}  // namespace course::cuda_flash
