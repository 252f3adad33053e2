// The topology: one object that owns the world communicator and cuts it into a TP x PP x DP grid of
// process groups, after picotron's process-group manager. Every rank knows its coordinates, its
// groups and its pipeline neighbours from here; chapters never compute a rank by hand.
//
// Ranks are laid out with TP fastest, then PP, then DP:  world rank = (dp * PP + pp) * TP + tp.
// Tensor parallelism communicates inside every layer, so its groups are consecutive ranks (the same
// machine, the fastest links); data parallelism communicates once per step, so it spans the farthest.
//   4 ranks as TP 2 x DP 2:   TP groups {0,1} {2,3}    DP groups {0,2} {1,3}
#pragma once
#include <memory>
#include <string>

#include "common/comm/communicator.h"

namespace course::parallel {

struct GridShape {
  int tp = 1;  // tensor-parallel ranks
  int pp = 1;  // pipeline stages
  int dp = 0;  // data-parallel replicas; 0 means whatever the world leaves: world / (tp * pp)
};

struct Coordinates {
  int tp = 0, pp = 0, dp = 0;
};

class Topology {
 public:
  // Takes the world and builds the groups (collective over the world). Throws UsageError when the
  // shape does not multiply out to the world size.
  Topology(std::unique_ptr<comm::Communicator> world, GridShape shape = {});
  Topology(const Topology&) = delete;
  Topology& operator=(const Topology&) = delete;

  comm::Communicator& world() { return *world_; }
  comm::Communicator& tp_group() { return *tp_; }  // same pp and dp coordinates
  comm::Communicator& pp_group() { return *pp_; }  // same tp and dp coordinates, ordered by stage
  comm::Communicator& dp_group() { return *dp_; }  // same tp and pp coordinates

  int rank() const { return world_->rank(); }
  int size() const { return world_->size(); }
  const GridShape& shape() const { return shape_; }
  const Coordinates& coordinates() const { return coordinates_; }
  int tp_rank() const { return coordinates_.tp; }
  int pp_rank() const { return coordinates_.pp; }
  int dp_rank() const { return coordinates_.dp; }
  int tp_size() const { return shape_.tp; }
  int pp_size() const { return shape_.pp; }
  int dp_size() const { return shape_.dp; }

  // Pipeline neighbours, as ranks in pp_group(): -1 at the ends of the pipeline.
  int previous_stage() const { return coordinates_.pp > 0 ? coordinates_.pp - 1 : -1; }
  int next_stage() const { return coordinates_.pp + 1 < shape_.pp ? coordinates_.pp + 1 : -1; }
  bool is_first_stage() const { return coordinates_.pp == 0; }
  bool is_last_stage() const { return coordinates_.pp + 1 == shape_.pp; }

  // The world rank at the given coordinates, and the coordinates of a world rank.
  int world_rank(const Coordinates& at) const;
  Coordinates coordinates_of(int world_rank) const;

  // "TP(2)-PP(1)-DP(2)-Rank(3)", as picotron prints it.
  std::string describe() const;

 private:
  std::unique_ptr<comm::Communicator> world_;
  GridShape shape_;
  Coordinates coordinates_;
  std::unique_ptr<comm::Communicator> owned_tp_, owned_pp_, owned_dp_;
  comm::Communicator *tp_ = nullptr, *pp_ = nullptr, *dp_ = nullptr;
};

}  // namespace course::parallel
