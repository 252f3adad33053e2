// A module's parameters as a safetensors file (the chapters' --save FILE): the names are the module's
// registration names ("0.weight", ...), so another framework can load them by name.
#pragma once
#include <string>

#include "common/checkpoint/safetensors.h"
#include "common/nn/module.h"

namespace course::checkpoint {

void save_parameters(const std::string& path, const nn::Module& module, const Metadata& metadata = {});

// Copies the parameters saved in `path` (by save_parameters, or consolidated from a sharded checkpoint)
// into `module`, by name: every parameter must be there with its shape, and nothing else may be.
// Throws CheckpointError naming the file and the first parameter at fault.
void load_parameters(const std::string& path, nn::Module& module);

// Throws UsageError when `path` could not be written later (its folder is missing or read-only), so a
// long run does not find out at its end.
void check_writable(const std::string& path);

}  // namespace course::checkpoint
