// ZeRO stage 3's units, shared by the layout (zero.cpp) and the sharding (zero_parameters.cpp): the
// outermost modules the policy wraps, in forward (registration) order, each with its module; then the
// root unit of every parameter left over (empty when none is).
#pragma once
#include <cstddef>
#include <vector>

#include "common/parallel/zero.h"

namespace course::parallel {

struct WrappedUnits {
  std::vector<std::vector<std::size_t>> units;
  std::vector<nn::Module*> modules;  // modules[k] owns units[k]; the root unit, last, has none
};

WrappedUnits wrapped_units(nn::Module& model, const std::vector<Tensor>& params, const UnitPolicy& policy);

}  // namespace course::parallel
