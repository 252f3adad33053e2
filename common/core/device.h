// Devices: where a tensor lives, and how a program picks one (--device auto|cpu|cuda).
#pragma once
#include <stdexcept>
#include <string>

namespace course {

enum class Device { cpu, cuda };

const char* device_name(Device device);

// Whether a CUDA GPU can be used by this process; when not, `reason` says why.
bool cuda_usable(std::string* reason = nullptr);
int cuda_device_count();

// Thrown for a request the user can fix (bad flag, missing GPU, unwritable file); main() turns it
// into one line on stderr and exit code 2.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Resolves --device. "auto" picks CUDA when a GPU is usable and otherwise the CPU, saying so in one
// line (printed when `announce` is true). Each rank takes the GPU numbered by its local rank, modulo
// the number of GPUs. Throws UsageError for an unknown name or for "cuda" without a usable GPU.
Device select_device(const std::string& choice, int local_rank = 0, bool announce = true);

}  // namespace course
