// Memory estimates and the check against the machine.
#include "common/cli/limits.h"

#include <CLI/CLI.hpp>

#include <unistd.h>

#include "common/cli/cli.h"
#include "common/core/errors.h"
#include "common/core/memory.h"

namespace course::cli {

double mlp_training_bytes(std::int64_t samples, std::int64_t features, std::int64_t hidden, std::int64_t layers,
                          std::int64_t batch) {
  const double f = static_cast<double>(features), h = static_cast<double>(hidden), l = static_cast<double>(layers);
  const double data = 2.0 * static_cast<double>(samples) * (f + 1);            // floats, two copies
  const double parameters = f * h + (l - 1) * h * h + 2 * h * l + 1;          // weights and biases
  const double activations = static_cast<double>(batch) * (f + 2 * h * l + 1);  // kept for backward
  return 4.0 * (data + 4 * parameters + 4 * activations);  // parameters x (value, grad, state, temporaries)
}

double physical_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<double>(pages) * static_cast<double>(page) : 8.0 * (1ull << 30);
}

void check_memory(double bytes, const std::string& flags, int ranks_here) {
  const double available = physical_memory_bytes() / (ranks_here > 0 ? ranks_here : 1);
  if (bytes <= available) return;
  auto human = [](double b) {
    return b >= 1e15 ? format_bytes(static_cast<std::int64_t>(1e15)) + "+" : format_bytes(static_cast<std::int64_t>(b));
  };
  throw UsageError(flags + " need about " + human(bytes) + ", more than the " + human(available) +
                   " of memory this rank can use");
}

void add_memory_limit_option(CLI::App& app, double& mb) {
  // Positive and finite, and a whole number of bytes from one to 2^60 once converted: below a byte the
  // budget rounds to none (which switched the limit off), beyond 2^63 the conversion wraps.
  const CLI::Validator bytes(
      [](std::string& input) -> std::string {
        const double value = std::stod(input) * 1024.0 * 1024.0;
        if (value >= 1.0 && value <= 0x1p60) return {};
        return "must be a budget from one byte (1/1048576 MiB) to 1 EiB (1099511627776 MiB), got '" + input + "'";
      },
      "from 1/1048576 to 1099511627776", "");
  app.add_option("--mem-limit-mb", mb, "A budget per rank on the counted memory (MiB); 0 is refused")
      ->check(PositiveFinite)
      ->check(bytes);
}

std::string apply_memory_limit(double mb, Device device) {
  if (mb <= 0) return "";
  set_memory_limit(device, static_cast<std::int64_t>(mb * 1024 * 1024));
  return ", memory limit " + format_bytes(memory_limit(device)) + " per rank";
}

}  // namespace course::cli
