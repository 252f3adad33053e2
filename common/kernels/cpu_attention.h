// Self-attention on the CPU, fused: the CPU backend's Kernels::attention and attention_backward.
#pragma once
#include "common/kernels/kernels.h"

namespace course::cpu {

void attention(const float* qkv, const AttentionShape& shape, float* probs, float* y);
void attention_backward(const float* qkv, const float* probs, const float* grad_y, const AttentionShape& shape,
                        float* grad_qkv);

}  // namespace course::cpu
