// A simulated network: a Communicator decorator that makes every operation take at least the time
// an alpha-beta model gives for it on a slower network, to show what overlap buys on a real cluster
// (10 GbE, 100 Gb/s) from a single machine. The real operation runs underneath; its work completes
// no earlier than the model's time. The link carries one message at a time, so operations queue:
//     finish_i = max(start_i, finish_{i-1}) + time_i
// Waiting sleeps rather than spins, so the CPU stays free for the backward pass. Output from a run
// with this decorator is always labelled "simulated network".
#pragma once
#include <chrono>
#include <memory>
#include <mutex>
#include <string>

#include "common/comm/communicator.h"

namespace course::comm {

struct NetworkModel {
  double alpha_us = 0;  // latency per message, microseconds
  double gbps = 0;      // bandwidth, GB/s (1e9 bytes per second)
  // The modelled seconds of `kind` on `bytes` over `ranks` ranks: a ring all-reduce sends
  // 2(n-1)/n of the data in 2(n-1) messages; all-gather, reduce-scatter and all-to-all half that; a broadcast,
  // reduce or point-to-point transfer the whole once.
  double seconds(OpKind kind, double bytes, int ranks) const;
};

// Parses "ALPHA_US,GBPS" (for example "10,1.25" for 10 GbE); throws UsageError otherwise.
NetworkModel parse_network(const std::string& text);
// "alpha 10 us, 1.25 GB/s", for the log's "simulated network: ..." label.
std::string describe(const NetworkModel& model);

std::unique_ptr<Communicator> simulate_network(std::unique_ptr<Communicator> inner, NetworkModel model);

// --sim-network's whole set-up, as chapters 05, 07 and 08 take it: nothing when `flag_value` is empty;
// otherwise a copy of `world` (split off it, so the world itself keeps its speed) whose every message
// takes at least the network's alpha-beta time, and the network's description. Collective over `world`.
struct SimulatedWorld {
  std::unique_ptr<Communicator> communicator;  // null without --sim-network
  std::string description;                     // "alpha 10 us, 1.25 GB/s"; empty without it
};
SimulatedWorld simulated_world(Communicator& world, const std::string& flag_value);

}  // namespace course::comm
