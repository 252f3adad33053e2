// Ring attention's blocks on the CPU: the CPU backend's Kernels::attention_block, its finish and backward.
#pragma once
#include "common/kernels/kernels.h"

namespace course::cpu {

void attention_block(const float* q, const float* k, const float* v, const float* q_pos, const float* k_pos,
                     const AttentionBlockShape& shape, float* row_max, float* row_sum, float* out);
void attention_block_finish(const float* row_max, const float* row_sum, const AttentionBlockShape& shape, float* out,
                            float* lse);
void attention_block_backward(const float* q, const float* k, const float* v, const float* q_pos, const float* k_pos,
                              const float* out, const float* lse, const float* grad_out, const AttentionBlockShape& shape,
                              float* grad_q, float* grad_k, float* grad_v);

}  // namespace course::cpu
