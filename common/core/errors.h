// The one error type a user can fix: a request that cannot be met (an unknown name, a missing GPU,
// an unwritable file). Library code says what was wrong in its own terms; the CLI layer (common/cli)
// names the flag it came from, prints one line and exits with code 2.
#pragma once
#include <stdexcept>

namespace course {

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

}  // namespace course
