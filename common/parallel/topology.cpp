// The grid arithmetic and the group communicators.
#include "common/parallel/topology.h"

#include <string>

#include "common/core/errors.h"

namespace course::parallel {

Topology::Topology(std::unique_ptr<comm::Communicator> world, GridShape shape)
    : world_(std::move(world)), shape_(shape) {
  const int n = world_->size();
  const std::string cp = shape_.cp != 1 ? " x CP " + std::to_string(shape_.cp) : "";
  if (shape_.tp < 1 || shape_.pp < 1 || shape_.dp < 0 || shape_.cp < 1)
    throw UsageError("grid TP " + std::to_string(shape_.tp) + cp + " x PP " + std::to_string(shape_.pp) + " x DP " +
                     std::to_string(shape_.dp) + ": every size must be positive");
  const int model = shape_.tp * shape_.cp * shape_.pp;  // the ranks of one replica
  if (shape_.dp == 0) {
    if (n % model != 0)
      throw UsageError("grid: " + std::to_string(n) + " ranks do not divide into TP " + std::to_string(shape_.tp) + cp +
                       " x PP " + std::to_string(shape_.pp));
    shape_.dp = n / model;
  }
  if (static_cast<long>(model) * shape_.dp != n)
    throw UsageError("grid TP " + std::to_string(shape_.tp) + cp + " x PP " + std::to_string(shape_.pp) + " x DP " +
                     std::to_string(shape_.dp) + " needs " + std::to_string(model * shape_.dp) + " ranks, the world has " +
                     std::to_string(n));
  coordinates_ = coordinates_of(world_->rank());
  const Coordinates at = coordinates_;
  const int TP = shape_.tp, CP = shape_.cp, PP = shape_.pp;
  // Each group is the ranks that agree on the other coordinates, ordered by its own. A group that spans
  // the whole world is the world itself, so pure data parallelism adds no communicator.
  auto make = [this, n](int size, int color, int key, std::unique_ptr<comm::Communicator>& owned) {
    if (size == n) return world_.get();
    owned = world_->split(color, key);
    return owned.get();
  };
  tp_ = make(TP, (at.dp * PP + at.pp) * CP + at.cp, at.tp, owned_tp_);
  cp_ = make(CP, (at.dp * PP + at.pp) * TP + at.tp, at.cp, owned_cp_);
  pp_ = make(PP, (at.dp * CP + at.cp) * TP + at.tp, at.pp, owned_pp_);
  dp_ = make(shape_.dp, (at.pp * CP + at.cp) * TP + at.tp, at.dp, owned_dp_);
  dp_cp_ = CP == 1 ? dp_ : make(shape_.dp * CP, at.pp * TP + at.tp, at.dp * CP + at.cp, owned_dp_cp_);
}

int Topology::world_rank(const Coordinates& at) const {
  return ((at.dp * shape_.pp + at.pp) * shape_.cp + at.cp) * shape_.tp + at.tp;
}

Coordinates Topology::coordinates_of(int world_rank) const {
  Coordinates at;
  at.tp = world_rank % shape_.tp;
  at.cp = (world_rank / shape_.tp) % shape_.cp;
  at.pp = (world_rank / (shape_.tp * shape_.cp)) % shape_.pp;
  at.dp = world_rank / (shape_.tp * shape_.cp * shape_.pp);
  return at;
}

std::string Topology::describe() const {
  return "TP(" + std::to_string(shape_.tp) + ")-" + (shape_.cp > 1 ? "CP(" + std::to_string(shape_.cp) + ")-" : "") +
         "PP(" + std::to_string(shape_.pp) + ")-DP(" + std::to_string(shape_.dp) + ")-Rank(" +
         std::to_string(world_->rank()) + ")";
}

}  // namespace course::parallel
