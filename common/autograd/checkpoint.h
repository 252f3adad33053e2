// Activation recomputation (Chen et al., "Training Deep Nets with Sublinear Memory Cost", 2016;
// torch.utils.checkpoint.checkpoint, its reentrant form): a piece of the forward runs without
// recording, so that nothing it computes is kept for backward but its input, and backward runs it again,
// recording this time, and backpropagates through it. Memory: one piece's activations at a time
// instead of every piece's; time: one more forward of each piece.
#pragma once
#include <functional>

#include "common/tensor/tensor.h"

namespace course::autograd {

// f(x), keeping only x. In backward, f runs again from x under the autocast the forward ran under (its
// dtype captured now), its parameters receive their gradients in that inner pass (their hooks fire
// there; end-of-backward callbacks still wait for the outer pass) and x receives its own. f must compute
// the same values both times: the same ops on the same inputs give the same bits, and a dropout inside
// must draw from the same seeds (the caller's to arrange). As PyTorch's reentrant checkpoint, x must
// require a gradient for anything inside to receive one; when it does not, f simply runs, recorded.
Tensor checkpoint(const std::function<Tensor(const Tensor&)>& f, const Tensor& x);

}  // namespace course::autograd
