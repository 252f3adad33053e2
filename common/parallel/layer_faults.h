// Mistakes a model-parallel implementation makes in its layer code, which the course's own layers can be
// told to make (chapter 08's --fault), so that --verify can be seen, and tested, to catch them. The
// communicator's faults (comm/faults.h) wrap one group of the run; these live in the layer code itself,
// for the whole process: a reference that runs the same layers (verify::ModelParallelReference, the
// 16-bit check by parts) makes the same mistake, as it would with a real bug, and only a reference that
// shares none of that code, the whole unsplit model (verify::Lockstep::check_whole), can see them.
#pragma once
#include <functional>

namespace course::parallel {

enum class LayerFault {
  sp_gather_rows,       // the sequence-parallel all-gather puts each rank's rows where the next rank's go
  ring_drop_block,      // ring attention leaves out the last key-value block to arrive (forward and backward)
  row_parallel_no_sum,  // a row-parallel layer keeps its own partial output, never summed over the TP group
};

// Whether `fault` is on now (a set fault whose predicate says so).
bool layer_fault(LayerFault fault);

// Sets `fault` for the life of the scope: on while `on` says so. One at a time.
class LayerFaultScope {
 public:
  LayerFaultScope(LayerFault fault, std::function<bool()> on);
  ~LayerFaultScope();
  LayerFaultScope(const LayerFaultScope&) = delete;
  LayerFaultScope& operator=(const LayerFaultScope&) = delete;
};

}  // namespace course::parallel
