// Faults injected on purpose at the communication layer, so that a chapter's --verify can be seen, and
// tested, to catch them: a communicator that wraps a group's and, while `active()` says so, skips its
// all-reduces (each rank keeps its own partial values, as if the call had been left out).
#pragma once
#include <functional>
#include <memory>

#include "common/comm/communicator.h"

namespace course::comm {

std::unique_ptr<Communicator> skip_all_reduces(std::unique_ptr<Communicator> inner, std::function<bool()> active);

}  // namespace course::comm
