// What the ranks of a group must agree on: one number (a one-element all-reduce: the ranks' mean loss,
// the largest step time, a sum of squares), every rank's figures, a string from one rank, and a failure
// on any rank, which every rank then reports alike instead of one rank throwing while the others wait in
// a collective.
#pragma once
#include <string>
#include <vector>

#include "common/comm/communicator.h"

namespace course::comm {

// `value` reduced over `group` with `op`, on every rank (float32, as the collectives carry it). Collective.
float all_reduce_scalar(Communicator& group, float value, ReduceOp op);

// Every rank's `values` (the same count on each rank), on every rank, in rank order: a pipeline's
// per-stage figures, for instance. Doubles travel bit for bit (two float32 slots each: a gather copies
// bits and never computes with them), so a byte count or a time arrives exactly. Collective.
std::vector<std::vector<double>> all_gather_values(Communicator& group, const std::vector<double>& values);

// Sends `text` from `root` to every rank of `group` (any bytes; floats carry them bit for bit). Collective.
void broadcast_string(Communicator& group, std::string& text, int root);

// Every rank offers its own error (empty: none). Returns, on every rank, the lowest failing rank and its
// message, or rank -1 and an empty message when no rank failed. Collective.
struct FirstError {
  int rank = -1;
  std::string message;
  bool any() const { return rank >= 0; }
};
FirstError first_error(Communicator& group, const std::string& my_error);

}  // namespace course::comm
