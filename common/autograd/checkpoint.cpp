// Recomputation inside backward: an inner backward pass through the piece run again.
#include "common/autograd/checkpoint.h"

#include "common/autograd/autograd.h"
#include "common/ops/autocast.h"

namespace course::autograd {

Tensor checkpoint(const std::function<Tensor(const Tensor&)>& f, const Tensor& x) {
  if (!grad_enabled() || !x.requires_grad()) return f(x);
  const DType autocast = autocast_dtype();
  Tensor out;
  {
    NoGradGuard no_grad;  // nothing recorded, nothing kept
    out = f(x);
  }
  return record(out, "checkpoint", {x}, [f, input = x.detach(), autocast](const Tensor& grad_output) {
    Tensor leaf = input.detach().set_requires_grad(true);
    Tensor again;
    {
      EnableGradGuard record_again;
      Autocast cast(autocast, autocast != DType::float32);  // backward runs outside autocast; the forward did not
      again = f(leaf);
    }
    backward(again, grad_output);
    return std::vector<Tensor>{leaf.grad()};
  });
}

}  // namespace course::autograd
