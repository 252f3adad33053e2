// The planner's formulas (formulas.h cites each).
#include "common/planner/formulas.h"

#include <stdexcept>
#include <string>

namespace course::planner {

double parameters(const GptShape& g) {
  const double l = static_cast<double>(g.layers), h = static_cast<double>(g.hidden);
  const double v = static_cast<double>(g.vocabulary), s = static_cast<double>(g.sequence);
  return 12 * l * h * h * (1 + 13 / (12 * h) + (v + s) / (12 * l * h));
}

double flops_per_iteration(const GptShape& g, double batch, bool recomputation) {
  const double l = static_cast<double>(g.layers), h = static_cast<double>(g.hidden);
  const double v = static_cast<double>(g.vocabulary), s = static_cast<double>(g.sequence);
  return recomputation ? 96 * batch * s * l * h * h * (1 + s / (6 * h) + v / (16 * l * h))
                       : 72 * batch * s * l * h * h * (1 + s / (6 * h) + v / (12 * l * h));
}

double training_seconds(double tokens, double parameters, int gpus, double flops_per_gpu, bool recomputation) {
  return (recomputation ? 8 : 6) * tokens * parameters / (gpus * flops_per_gpu);
}

double activation_bytes_per_layer(const GptShape& g, double micro_batch, int tp, bool sequence_parallel, Recompute r) {
  if (tp < 1) throw std::invalid_argument("activation_bytes_per_layer: " + std::to_string(tp) + " tensor-parallel ranks");
  const double s = static_cast<double>(g.sequence), h = static_cast<double>(g.hidden), a = static_cast<double>(g.heads);
  const double t = tp, sbh = s * micro_batch * h;
  switch (r) {
    case Recompute::full: return sequence_parallel ? 2 * sbh / t : 2 * sbh;
    case Recompute::selective: return sequence_parallel ? 34 * sbh / t : sbh * (10 + 24 / t);
    case Recompute::none: break;
  }
  return sequence_parallel ? sbh / t * (34 + 5 * a * s / h) : sbh * (10 + 24 / t + 5 * a * s / (h * t));
}

ModelStates zero_model_states(int stage, double psi, int n, DType precision, parallel::ZeroOptions::Offload offload) {
  using Offload = parallel::ZeroOptions::Offload;
  const double b = static_cast<double>(element_size(precision));  // a parameter, a gradient
  const double k = precision == DType::float32 ? 8 : 12;           // the paper's K
  const double part = stage == 0 ? psi : psi / n;                   // what this rank's optimizer updates
  ModelStates m;
  m.params = stage <= 2 ? b * psi : b * psi / n;
  m.grads = stage <= 1 ? b * psi : b * psi / n;
  m.optimizer = k * part;
  if (offload == Offload::none) return m;
  // Offloaded: the float32 masters (in float32 a copy of the parameters) and Adam's moments, 12 bytes.
  m.host = 12 * part;
  m.optimizer = 0;
  if (stage >= 2) m.host += m.grads, m.grads = 0;
  if (offload == Offload::parameters) {
    if (precision != DType::float32) m.host += m.params;  // in float32 the masters are this part
    m.params = 0;
  }
  return m;
}

}  // namespace course::planner
