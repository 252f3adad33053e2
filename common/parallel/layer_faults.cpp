// The layer faults' switch: one per process, read by every thread that runs the layers.
#include "common/parallel/layer_faults.h"

#include <stdexcept>
#include <utility>

namespace course::parallel {
namespace {

struct Switch {
  bool set = false;
  LayerFault fault{};
  std::function<bool()> on;
};
// Written before the run's first step and after its last, read while the layers run.
Switch& the_switch() {
  static Switch s;
  return s;
}

}  // namespace

bool layer_fault(LayerFault fault) {
  const Switch& s = the_switch();
  return s.set && s.fault == fault && s.on && s.on();
}

LayerFaultScope::LayerFaultScope(LayerFault fault, std::function<bool()> on) {
  Switch& s = the_switch();
  if (s.set) throw std::logic_error("LayerFaultScope: a layer fault is already set");
  s = Switch{true, fault, std::move(on)};
}

LayerFaultScope::~LayerFaultScope() { the_switch() = Switch{}; }

}  // namespace course::parallel
