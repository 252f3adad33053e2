// The optimizer flags of chapters 01 and 02.
#include "common/cli/sgd_options.h"

#include <cstdio>

#include <CLI/CLI.hpp>

#include "common/cli/cli.h"

namespace course::cli {

void add_sgd_options(CLI::App& app, SgdOptions& options) {
  app.add_option("--lr", options.lr, "SGD learning rate")->check(PositiveFinite)->capture_default_str();
  add_precision_options(app, options.precision);
}

void apply(const SgdOptions& options, Device device) { apply_precision(options.precision, device); }

optim::Recipe make_sgd(const std::vector<Tensor>& params, const SgdOptions& options) {
  return optim::Recipe("sgd", params, options.lr, 0, options.precision.dtype(), nullptr, options.precision.loss_scale);
}

std::string describe(const SgdOptions& options) {
  char lr[32];
  std::snprintf(lr, sizeof lr, "%g", options.lr);
  return "SGD at lr " + std::string(lr) + ", " + precision_description(options.precision);
}

}  // namespace course::cli
