// Groups whose members are threads of one process: a Communicator for each member, their collectives
// meeting in shared memory, for a reference that must compute what several ranks compute with their
// roundings (verify/model_parallel_reference.h). It adds in the ring's order (algorithms::reduce_scatter_step):
// 16-bit values computed in float32 and rounded to 16 bits after each addition (an average's values
// first multiplied by 1/N, rounded), as the MPI backend adds them in any group, and float32 values (an
// average divided once) as it adds them in a group that asked for that order
// (Communicator::add_in_ring_order) or of two ranks, where the order cannot matter. So its sums are a
// run's bit for bit at any size; in another MPI group of more, MPI chooses its own order.
//
// One thread computes at a time: the threads of a run take turns (Turns), each holding the turn from
// its start and giving it up only while it waits for others at a collective. So they never run
// concurrently (no state of the library needs to be thread-safe), and a run costs what running them
// one after the other costs. A thread may be a member of several groups made with the same Turns (a
// tensor-parallel and a context-parallel group, say). The members of a group must call the same
// collectives in the same order, as MPI requires; send_recv is a collective here (every member calls it
// at once, as a ring does), and lone sends and receives are not supported.
#pragma once
#include <functional>
#include <memory>
#include <vector>

#include "common/comm/communicator.h"

namespace course::verify {

using comm::Communicator;

class Turns;  // the threads of one run and their turn (local_group.cpp)

// Runs work(0), ..., work(n - 1), each on a thread of its own, taking `turns`, and returns when all have
// finished. An exception in one thread ends the others' waits at their collectives, as does a wait that
// no thread is left to answer; the first thread's own error is rethrown here.
void run_in_turns(Turns& turns, int n, const std::function<void(int thread)>& work);

class LocalGroup {
 public:
  // `turns`: those of the run its members' threads belong to (a new one when none is given).
  explicit LocalGroup(int size, std::shared_ptr<Turns> turns = nullptr);
  ~LocalGroup();
  LocalGroup(const LocalGroup&) = delete;
  LocalGroup& operator=(const LocalGroup&) = delete;

  int size() const { return static_cast<int>(members_.size()); }
  const std::shared_ptr<Turns>& turns() const { return turns_; }
  // Member `rank`'s communicator: valid as long as the group, so modules may keep it between runs.
  Communicator& member(int rank);
  // run_in_turns over this group's members: work(member(0)), ..., work(member(size - 1)).
  void run(const std::function<void(Communicator& member)>& work);

  struct Exchange;  // the members' calls of the current round (local_group.cpp)

 private:
  std::shared_ptr<Turns> turns_;
  std::unique_ptr<Exchange> exchange_;
  std::vector<std::unique_ptr<Communicator>> members_;
};

std::shared_ptr<Turns> make_turns();

}  // namespace course::verify
