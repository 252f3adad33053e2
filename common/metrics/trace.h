// Timelines as Chrome trace JSON (the Trace Event Format): open the file in https://ui.perfetto.dev
// or chrome://tracing. Each process is a rank, each thread a lane (backward compute, communication).
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace course::metrics {

class ChromeTrace {
 public:
  // A complete event ("ph": "X") from begin to end, in milliseconds.
  void add(int rank, const std::string& lane, const std::string& name, double begin_ms, double end_ms,
           const nlohmann::json& args = nlohmann::json::object());
  void label(const std::string& text) { label_ = text; }  // shown in the trace's metadata
  // Writes the file; throws UsageError when it cannot be written.
  // Writes the trace to `path`, which `flag` named (a failure names both).
  void write(const std::string& path, const std::string& flag = "--trace") const;
  const nlohmann::json& events() const { return events_; }

 private:
  int lane_id(int rank, const std::string& lane);
  nlohmann::json events_ = nlohmann::json::array();
  std::vector<std::pair<int, std::string>> lanes_;
  std::string label_;
};

}  // namespace course::metrics
