// The one error type a user can fix: a request that cannot be met (an unknown name, a missing GPU,
// an unwritable file). Library code says what was wrong in its own terms; the CLI layer (common/cli)
// names the flag it came from, prints one line and exits with code 2.
#pragma once
#include <stdexcept>

namespace course {

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// A failure every rank of the job throws alike, once they have agreed on it (parallel::on_rank0's work
// that failed on rank 0: a full disk under a trace): reported once, the ranks leave together, exit code 1.
struct SharedError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

}  // namespace course
