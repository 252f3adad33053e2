// The lock-step check of a distributed (or accumulated) training run: at every step, from the same
// parameters, the gradient and loss the run is about to apply must equal a single-rank reference
// within the float32 bound derived in compare.h. The reference re-takes the trained parameters
// before every step, so no chaotic drift between the runs enters the comparison, however many
// steps are taken. Used by 02, 04 and every later chapter (buckets, resume, ZeRO, TP/PP).
//
// The run's step gradient is scale * (part 0 + ... + part R-1): the ranks' shares of the global batch
// (averaged by DDP: scale 1/R), or micro-batches (accumulated: scale 1). The reference, on one rank,
// recomputes every part exactly as the run did (same samples, same shapes, same weights), adds them
// exactly, and checks that the run's combination is that sum up to the rounding of R additions. A
// wrong average (divided twice, a share skipped, a rank's gradient left out) fails at its first step.
//
//   begin_step(trained)                       the reference copies the trained parameters
//   ... the run's forward, backward and gradient synchronisation ...
//   check(step, trained, loss, parts, ...)    before the optimizer step
//   finish()                                  the verdict, on every rank
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "common/comm/communicator.h"
#include "common/nn/module.h"
#include "common/verify/compare.h"

namespace course::verify {

// Computes part `index` of the step into `model`'s gradients (zeroed beforehand), exactly as the run
// computes it, and returns that part's loss.
using PartFunction = std::function<float(nn::Module& model, std::size_t index)>;

struct LockstepSummary {
  bool passed = true;
  std::int64_t steps = 0;
  std::int64_t first_failed_step = -1;
  double worst_gradient_diff = 0, worst_gradient_ratio = 0;  // ratio: difference / its bound
  double worst_loss_diff = 0, worst_loss_ratio = 0;
  std::string first_failure;  // what differed at the first failed step (on rank 0, which logs)
};

class LockstepVerifier {
 public:
  // `reference`: a model of the trained model's architecture (its values are overwritten each step).
  // `group`: the ranks that run the step together, or nullptr for one process; rank 0 checks.
  LockstepVerifier(std::shared_ptr<nn::Module> reference, comm::Communicator* group);

  void begin_step(const nn::Module& trained);

  // The format the run adds its parts in: float32 (the default), or a 16-bit format when a
  // compression hook sums the gradients in 16 bits. The bound grows with its unit roundoff.
  void set_rounding(Rounding rounding) { rounding_ = rounding; }

  // `trained`'s gradients and `loss` are what the run is about to apply: scale * the sum of `parts`
  // parts, each computed by `part`.
  void check(std::int64_t step, const nn::Module& trained, float loss, std::size_t parts, double scale,
             const PartFunction& part);

  // The verdict, the same on every rank of the group. Collective.
  LockstepSummary finish();

 private:
  std::shared_ptr<nn::Module> reference_;
  comm::Communicator* group_;
  Rounding rounding_ = kFloat32Rounding;
  LockstepSummary summary_;
};

}  // namespace course::verify
