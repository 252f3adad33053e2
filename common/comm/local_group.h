// A group whose members are threads of one process: a Communicator for each member, their collectives
// meeting in shared memory, for a reference that must compute what several ranks compute with their
// roundings (verify/tensor_parallel_reference.h). Its reductions are the MPI backend's, value for value:
// float32 sums added in rank order (an average divided once), 16-bit ones computed in float32 and
// rounded to 16 bits after each addition (an average's values first multiplied by 1/N, rounded). For
// two members that is what any backend computes, since adding two values does not depend on their
// order; for more, MPI chooses its own order and only the float32 results agree within their rounding.
//
// One member computes at a time: a member holds the group's turn from its start and gives it up only
// while it waits for the others at a collective. So the members never run concurrently (no state of
// the library needs to be thread-safe), and the group costs what running them one after the other
// costs. Every member must call the same collectives in the same order, as MPI requires; send_recv is a
// collective here (every member calls it at once, as a ring does), and lone sends and receives are not
// supported.
#pragma once
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "common/comm/communicator.h"

namespace course::comm {

class LocalGroup {
 public:
  explicit LocalGroup(int size);
  ~LocalGroup();
  LocalGroup(const LocalGroup&) = delete;
  LocalGroup& operator=(const LocalGroup&) = delete;

  int size() const { return static_cast<int>(members_.size()); }
  // Member `rank`'s communicator: valid as long as the group, so modules may keep it between runs.
  Communicator& member(int rank);
  // Runs work(member) for every member, each on a thread of its own, and returns when all have
  // finished. An exception in one member ends the others' waits at their collectives; the first is
  // rethrown here.
  void run(const std::function<void(Communicator& member)>& work);

  // Shared between the members (communicators of this group only).
  struct Exchange;

 private:
  std::unique_ptr<Exchange> exchange_;
  std::vector<std::unique_ptr<Communicator>> members_;
};

}  // namespace course::comm
