// A fault at the communication layer (faults.h): a communicator that wraps a group's and, while fault
// `name` is active, skips its all-reduces (each rank keeps its own partial values, as if the call had
// been left out). A chapter wraps the one group its fault concerns, below its fence.
#pragma once
#include <memory>
#include <string>

#include "common/comm/communicator.h"

namespace course::faults {

std::unique_ptr<comm::Communicator> skip_all_reduces(std::unique_ptr<comm::Communicator> inner, std::string name);

}  // namespace course::faults
