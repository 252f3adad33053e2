// --precision fp32|bf16|fp16: the one precision flag of every chapter that trains. bf16 and fp16 are
// mixed precision: float32 master parameters, the forward under autocast (common/ops/autocast.h), and
// for fp16 dynamic loss scaling (common/optim/grad_scaler.h), all carried by the training recipe.
#pragma once
#include <CLI/CLI.hpp>
#include <string>

#include "common/core/device.h"
#include "common/core/dtype.h"

namespace course::cli {

struct PrecisionOptions {
  std::string precision = "fp32";
  float loss_scale = 65536.0f;  // fp16: GradScaler's init_scale, 2^16
  bool tf32 = false;            // --tf32: the GPU's float32 matrix products in TF32
  DType dtype() const;  // float32, bfloat16 or float16
};

void add_precision_options(CLI::App& app, PrecisionOptions& options);
// Once the device is known: --tf32 allows TF32 on a GPU (common/kernels/kernels.h: set_allow_tf32) and
// is refused elsewhere, one line naming the flag (UsageError).
void apply_precision(const PrecisionOptions& options, Device device);

// For the start-up line: "fp32", "mixed precision bf16 (float32 masters, autocast)" or the same for fp16
// with its loss scaling.
std::string precision_description(const PrecisionOptions& options);

}  // namespace course::cli
