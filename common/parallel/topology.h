// The topology: one object that owns the world communicator and cuts it into a TP x CP x PP x DP grid
// of process groups, after picotron's process-group manager. Every rank knows its coordinates, its
// groups and its pipeline neighbours from here; chapters never compute a rank by hand.
//
// Ranks are laid out with TP fastest, then CP, then PP, then DP (Megatron-LM's order):
//   world rank = ((dp * PP + pp) * CP + cp) * TP + tp.
// Tensor parallelism communicates inside every layer, so its groups are consecutive ranks (the same
// machine, the fastest links); context parallelism inside every attention, next to it; data
// parallelism communicates once per step, so it spans the farthest.
//   4 ranks as TP 2 x DP 2:   TP groups {0,1} {2,3}    DP groups {0,2} {1,3}
// Context-parallel ranks hold the same parameters and see different tokens of the same sequences, so
// gradients are averaged over the data- and context-parallel ranks together (dp_cp_group).
#pragma once
#include <memory>
#include <string>

#include "common/comm/communicator.h"

namespace course::parallel {

struct GridShape {
  int tp = 1;  // tensor-parallel ranks
  int pp = 1;  // pipeline stages
  int dp = 0;  // data-parallel replicas; 0 means whatever the world leaves: world / (tp * pp * cp)
  int cp = 1;  // context-parallel ranks: each sequence split across them (context_parallel.h)
};

struct Coordinates {
  int tp = 0, pp = 0, dp = 0, cp = 0;
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
  comm::Communicator& dp_group() { return *dp_; }  // same tp, cp and pp coordinates
  comm::Communicator& cp_group() { return *cp_; }  // same tp, pp and dp coordinates
  // Same tp and pp coordinates: the ranks that hold the same parameters (the replicas and, within
  // each, the context-parallel ranks), what the gradients are averaged over. dp_group() when CP is 1.
  comm::Communicator& dp_cp_group() { return *dp_cp_; }

  int rank() const { return world_->rank(); }
  int size() const { return world_->size(); }
  std::string backend_name() const { return world_->backend_name(); }
  const GridShape& shape() const { return shape_; }
  const Coordinates& coordinates() const { return coordinates_; }
  int tp_rank() const { return coordinates_.tp; }
  int pp_rank() const { return coordinates_.pp; }
  int dp_rank() const { return coordinates_.dp; }
  int cp_rank() const { return coordinates_.cp; }
  int tp_size() const { return shape_.tp; }
  int pp_size() const { return shape_.pp; }
  int dp_size() const { return shape_.dp; }
  int cp_size() const { return shape_.cp; }

  // Pipeline neighbours, as ranks in pp_group(): -1 at the ends of the pipeline.
  int previous_stage() const { return coordinates_.pp > 0 ? coordinates_.pp - 1 : -1; }
  int next_stage() const { return coordinates_.pp + 1 < shape_.pp ? coordinates_.pp + 1 : -1; }
  bool is_first_stage() const { return coordinates_.pp == 0; }
  bool is_last_stage() const { return coordinates_.pp + 1 == shape_.pp; }

  // The world rank at the given coordinates, and the coordinates of a world rank.
  int world_rank(const Coordinates& at) const;
  Coordinates coordinates_of(int world_rank) const;

  // "TP(2)-PP(1)-DP(2)-Rank(3)", as picotron prints it; "TP(2)-CP(2)-PP(1)-DP(1)-Rank(3)" with CP.
  std::string describe() const;

 private:
  std::unique_ptr<comm::Communicator> world_;
  GridShape shape_;
  Coordinates coordinates_;
  std::unique_ptr<comm::Communicator> owned_tp_, owned_pp_, owned_dp_, owned_cp_, owned_dp_cp_;
  comm::Communicator *tp_ = nullptr, *pp_ = nullptr, *dp_ = nullptr, *cp_ = nullptr, *dp_cp_ = nullptr;
};

}  // namespace course::parallel
