// Devices: where a tensor lives, and how a program picks one (--device auto|cpu|cuda).
#pragma once
#include <string>

#include "common/core/errors.h"

namespace course {

enum class Device { cpu, cuda };

const char* device_name(Device device);

// Whether a CUDA GPU can be used by this process; when not, `reason` says why.
bool cuda_usable(std::string* reason = nullptr);
int cuda_device_count();

// Resolves --device. "auto" picks CUDA when a GPU is usable and otherwise the CPU, saying so in one
// line (printed when `announce` is true). Each rank takes the GPU numbered by its local rank, modulo
// the number of GPUs. Throws UsageError for an unknown name or for "cuda" without a usable GPU (the
// CLI layer adds the flag's name).
Device select_device(const std::string& choice, int local_rank = 0, bool announce = true);

}  // namespace course
