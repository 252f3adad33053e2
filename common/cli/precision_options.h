// --precision fp32|bf16|fp16: the one precision flag of every chapter that trains. bf16 and fp16 are
// mixed precision: float32 master parameters, the forward under autocast (common/ops/autocast.h), and
// for fp16 dynamic loss scaling (common/optim/grad_scaler.h), all carried by the training recipe.
#pragma once
#include "common/cli/forward.h"
#include <string>

#include "common/core/device.h"
#include "common/core/dtype.h"

namespace course::cli {

struct PrecisionOptions {
  std::string precision = "fp32";
  float loss_scale = 65536.0f;  // fp16: GradScaler's init_scale, 2^16
  bool tf32 = false;            // --tf32: the GPU's float32 matrix products in TF32
  std::string reduce_dtype = "fp32";  // --reduce-dtype: the type data parallelism averages gradients in
  DType dtype() const;         // float32, bfloat16 or float16
  DType reduce() const;        // the same for --reduce-dtype
};

void add_precision_options(CLI::App& app, PrecisionOptions& options);
// --reduce-dtype fp32|bf16|fp16, in the chapters whose data parallelism averages gradients with DDP's
// hooks (04, 06, 08): PyTorch FSDP's MixedPrecision.reduce_dtype. Chapter 05 teaches the same as its
// --comm-hook, and ZeRO (07) reduces in its --precision.
void add_reduce_dtype_option(CLI::App& app, PrecisionOptions& options);
// Once the device is known: --tf32 allows TF32 on a GPU (common/kernels/kernels.h: set_allow_tf32) and
// is refused elsewhere, one line naming the flag (UsageError).
void apply_precision(const PrecisionOptions& options, Device device);

// For the start-up line: "fp32", "mixed precision bf16 (float32 masters, autocast)" or the same for fp16
// with its loss scaling.
std::string precision_description(const PrecisionOptions& options);

}  // namespace course::cli
