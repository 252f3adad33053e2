// The grid arithmetic and the group communicators.
#include "common/parallel/topology.h"

#include <string>

#include "common/core/errors.h"

namespace course::parallel {

Topology::Topology(std::unique_ptr<comm::Communicator> world, GridShape shape)
    : world_(std::move(world)), shape_(shape) {
  const int n = world_->size();
  if (shape_.tp < 1 || shape_.pp < 1 || shape_.dp < 0)
    throw UsageError("grid TP " + std::to_string(shape_.tp) + " x PP " + std::to_string(shape_.pp) + " x DP " +
                     std::to_string(shape_.dp) + ": every size must be positive");
  if (shape_.dp == 0) {
    if (n % (shape_.tp * shape_.pp) != 0)
      throw UsageError("grid: " + std::to_string(n) + " ranks do not divide into TP " + std::to_string(shape_.tp) +
                       " x PP " + std::to_string(shape_.pp));
    shape_.dp = n / (shape_.tp * shape_.pp);
  }
  if (static_cast<long>(shape_.tp) * shape_.pp * shape_.dp != n)
    throw UsageError("grid TP " + std::to_string(shape_.tp) + " x PP " + std::to_string(shape_.pp) + " x DP " +
                     std::to_string(shape_.dp) + " needs " + std::to_string(shape_.tp * shape_.pp * shape_.dp) +
                     " ranks, the world has " + std::to_string(n));
  coordinates_ = coordinates_of(world_->rank());
  const auto [tp, pp, dp] = coordinates_;
  // Each group is the ranks that agree on the other two coordinates, ordered by its own. A group
  // that spans the whole world is the world itself, so pure data parallelism adds no communicator.
  auto make = [this, n](int size, int color, int key, std::unique_ptr<comm::Communicator>& owned) {
    if (size == n) return world_.get();
    owned = world_->split(color, key);
    return owned.get();
  };
  tp_ = make(shape_.tp, dp * shape_.pp + pp, tp, owned_tp_);
  pp_ = make(shape_.pp, dp * shape_.tp + tp, pp, owned_pp_);
  dp_ = make(shape_.dp, pp * shape_.tp + tp, dp, owned_dp_);
}

int Topology::world_rank(const Coordinates& at) const { return (at.dp * shape_.pp + at.pp) * shape_.tp + at.tp; }

Coordinates Topology::coordinates_of(int world_rank) const {
  return {world_rank % shape_.tp, (world_rank / shape_.tp) % shape_.pp, world_rank / (shape_.tp * shape_.pp)};
}

std::string Topology::describe() const {
  return "TP(" + std::to_string(shape_.tp) + ")-PP(" + std::to_string(shape_.pp) + ")-DP(" + std::to_string(shape_.dp) +
         ")-Rank(" + std::to_string(world_->rank()) + ")";
}

}  // namespace course::parallel
