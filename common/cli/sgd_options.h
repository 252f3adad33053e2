// The optimizer flags of chapters 01 and 02, which train with plain SGD before chapter 04 teaches mixed
// precision: --lr and the run's precision flags (--precision, --loss-scale, --tf32: precision_options.h) in one
// struct, so that their lessons build the recipe in one call and show none of that plumbing.
#pragma once
#include "common/cli/forward.h"
#include <string>
#include <vector>

#include "common/cli/precision_options.h"
#include "common/core/device.h"
#include "common/optim/recipe.h"

namespace course::cli {

struct SgdOptions {
  float lr = 0.01f;
  PrecisionOptions precision;
};

void add_sgd_options(CLI::App& app, SgdOptions& options);
// Once the device is known: --tf32 on a GPU, refused elsewhere (precision_options.h: apply_precision).
void apply(const SgdOptions& options, Device device);
// Plain SGD at the constant rate --lr, in the run's --precision (optim::Recipe's "sgd").
optim::Recipe make_sgd(const std::vector<Tensor>& params, const SgdOptions& options);
// For the start-up line: "SGD at lr 0.01, fp32" (or mixed precision's description).
std::string describe(const SgdOptions& options);

}  // namespace course::cli
