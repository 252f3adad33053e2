// Chrome trace events, with names for every rank and lane.
#include "common/metrics/trace.h"

#include <cerrno>
#include <cstring>
#include <stdexcept>

#include <fstream>

#include "common/core/errors.h"

namespace course::metrics {

int ChromeTrace::lane_id(int rank, const std::string& lane) {
  for (std::size_t i = 0; i < lanes_.size(); ++i)
    if (lanes_[i] == std::make_pair(rank, lane)) return static_cast<int>(i);
  lanes_.emplace_back(rank, lane);
  const int id = static_cast<int>(lanes_.size() - 1);
  events_.push_back({{"ph", "M"}, {"name", "process_name"}, {"pid", rank}, {"args", {{"name", "rank " + std::to_string(rank)}}}});
  events_.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", rank}, {"tid", id}, {"args", {{"name", lane}}}});
  return id;
}

void ChromeTrace::add(int rank, const std::string& lane, const std::string& name, double begin_ms, double end_ms,
                      const nlohmann::json& args) {
  const int tid = lane_id(rank, lane);
  events_.push_back({{"ph", "X"}, {"name", name}, {"pid", rank}, {"tid", tid}, {"ts", begin_ms * 1000.0},
                     {"dur", (end_ms - begin_ms) * 1000.0}, {"args", args}});
}

void ChromeTrace::write(const std::string& path, const std::string& flag) const {
  std::ofstream out(path);
  if (!out) throw UsageError(flag + ": " + path + ": cannot open for writing");
  nlohmann::json doc = {{"traceEvents", events_}, {"displayTimeUnit", "ms"}, {"metadata", {{"label", label_}}}};
  out << doc.dump(1) << '\n';
  out.flush();
  if (!out) throw std::runtime_error(flag + ": " + path + ": the trace could not be written (" + std::strerror(errno) + ")");
}

}  // namespace course::metrics
