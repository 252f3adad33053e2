// The ranks' shares against the global batch (data_order.h).
#include "common/verify/data_order.h"

#include <algorithm>
#include <cstdio>
#include <map>

#include "common/comm/agree.h"  // all_gather_values, all_reduce_scalar

namespace course::verify {

std::string check_data_order(comm::Communicator& group, const std::vector<std::int64_t>& mine,
                             const std::vector<std::int64_t>& global) {
  // Shares may differ in length by one (a batch the ranks do not divide): each travels padded to the
  // longest, its own length first. Indices below 2^53 travel exactly as doubles.
  const auto longest = static_cast<std::size_t>(
      comm::all_reduce_scalar(group, static_cast<float>(mine.size()), comm::ReduceOp::max));
  std::vector<double> sent(longest + 1, -1.0);
  sent[0] = static_cast<double>(mine.size());
  for (std::size_t i = 0; i < mine.size(); ++i) sent[i + 1] = static_cast<double>(mine[i]);
  const auto all = comm::all_gather_values(group, sent);
  if (group.rank() != 0) return "";
  const std::size_t ranks = all.size();
  std::vector<std::vector<std::int64_t>> shares(ranks);
  std::size_t taken = 0;
  for (std::size_t r = 0; r < ranks; ++r) {
    const auto count = static_cast<std::size_t>(all[r][0]);
    for (std::size_t i = 0; i < count; ++i) shares[r].push_back(static_cast<std::int64_t>(all[r][i + 1]));
    taken += count;
  }
  char line[320];
  // Every sample of the global batch once: count what the ranks took against what the batch holds.
  std::map<std::int64_t, std::vector<int>> takers;
  for (std::size_t r = 0; r < ranks; ++r)
    for (const std::int64_t sample : shares[r]) takers[sample].push_back(static_cast<int>(r));
  std::map<std::int64_t, int> wanted;
  for (const std::int64_t sample : global) ++wanted[sample];
  for (const auto& [sample, count] : wanted) {
    const auto it = takers.find(sample);
    const std::size_t got = it == takers.end() ? 0 : it->second.size();
    if (got == static_cast<std::size_t>(count)) continue;
    std::string who;
    if (it != takers.end())
      for (const int r : it->second) who += (who.empty() ? "rank " : ", rank ") + std::to_string(r);
    std::snprintf(line, sizeof line, "sample %lld of the global batch is taken %zu time(s)%s%s, not %d: the ranks' "
                  "shares must be the global batch exactly once", static_cast<long long>(sample), got,
                  who.empty() ? "" : " by ", who.c_str(), count);
    return line;
  }
  for (const auto& [sample, ranks_of] : takers)
    if (wanted.count(sample) == 0) {
      std::snprintf(line, sizeof line, "rank %d trains on sample %lld, which the global batch does not hold",
                    ranks_of.front(), static_cast<long long>(sample));
      return line;
    }
  // In the single-rank run's order: position i is rank i mod R's sample i / R.
  if (taken != global.size()) return "the ranks' shares hold " + std::to_string(taken) + " samples, the global batch " +
                                    std::to_string(global.size());
  for (std::size_t i = 0; i < global.size(); ++i) {
    const std::size_t r = i % ranks, k = i / ranks;
    if (k < shares[r].size() && shares[r][k] == global[i]) continue;
    std::snprintf(line, sizeof line, "position %zu of the global batch (sample %lld) is not rank %zu's sample %zu: the "
                  "shares are out of the single-rank run's order", i, static_cast<long long>(global[i]), r, k);
    return line;
  }
  return "";
}

}  // namespace course::verify
