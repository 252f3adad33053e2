// The precision flag.
#include "common/cli/precision_options.h"

#include <CLI/CLI.hpp>

#include "common/cli/cli.h"
#include "common/core/errors.h"
#include "common/kernels/kernels.h"

#include <cmath>
#include <cstdlib>

namespace course::cli {

namespace {
DType dtype_named(const std::string& name) {
  if (name == "bf16") return DType::bfloat16;
  if (name == "fp16") return DType::float16;
  return DType::float32;
}
}  // namespace

DType PrecisionOptions::dtype() const { return dtype_named(precision); }
DType PrecisionOptions::reduce() const { return dtype_named(reduce_dtype); }

std::string precision_description(const PrecisionOptions& options) {
  if (options.reduce_dtype != "fp32") {
    PrecisionOptions plain = options;
    plain.reduce_dtype = "fp32";
    return precision_description(plain) + ", gradients averaged in " + options.reduce_dtype;
  }
  if (options.tf32) {
    PrecisionOptions plain = options;
    plain.tf32 = false;
    return precision_description(plain) + ", TF32 matrix products";
  }
  if (options.precision == "bf16") return "mixed precision bf16 (float32 masters, autocast)";
  if (options.precision == "fp16")
    return "mixed precision fp16 (float32 masters, autocast, dynamic loss scale from 2^" +
           std::to_string(std::ilogb(options.loss_scale)) + ")";
  return "fp32";
}

void add_precision_options(CLI::App& app, PrecisionOptions& options) {
  app.add_option("--precision", options.precision,
                 "fp32; or mixed precision, float32 masters with the matrix products in bf16, or in fp16 with "
                 "dynamic loss scaling")
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}))
      ->capture_default_str();
  app.add_option("--loss-scale", options.loss_scale,
                 "fp16: the initial loss scale, a power of two (halved after each step whose gradient overflows, "
                 "doubled after 2000 clean ones)")
      ->check(CLI::Validator(
          [](std::string& text) {
            // A power of two, so that scaling and unscaling are exact and a lock-step reference that
            // unscales each part gives the bits the run gives unscaling the sum.
            char* end = nullptr;
            const float value = std::strtof(text.c_str(), &end);
            int exponent = 0;
            if (text.empty() || *end != '\0' || !decimal_number(text) || !(value >= 1.0f && value <= 0x1p100f) ||
                std::frexp(value, &exponent) != 0.5f)
              return std::string("must be a power of two from 1 to 2^100, got ") + text;
            return std::string();
          },
          "POWER OF TWO"))
      ->capture_default_str();
  refuse_inert(app, "--loss-scale", [&options] {
    return options.precision == "fp16" ? std::string()
                                       : "does nothing without --precision fp16 (the loss scale is fp16's; --precision is " +
                                             options.precision + ")";
  });
  app.add_flag("--tf32", options.tf32,
               "GPU: float32 matrix products on tensor cores in TF32 (a 10-bit mantissa; PyTorch's allow_tf32); off "
               "by default, so results stay comparable with the CPU's");
}

void add_reduce_dtype_option(CLI::App& app, PrecisionOptions& options) {
  app.add_option("--reduce-dtype", options.reduce_dtype,
                 "The type data parallelism averages gradients in: fp32, or bf16 or fp16 for half the bytes (each "
                 "rank's gradient divided by the ranks and rounded, the sum in 16 bits)")
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}))
      ->capture_default_str();
}

void apply_precision(const PrecisionOptions& options, Device device) {
  if (options.tf32 && device != Device::cuda)
    throw UsageError("--tf32: TF32 is a GPU tensor-core format, and this run is on the CPU (--device cuda needs a GPU)");
  set_allow_tf32(options.tf32);
}

}  // namespace course::cli
