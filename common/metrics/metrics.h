// Metrics as JSON lines (one object per line), the format scripts/plot.py reads.
#pragma once
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

namespace course::metrics {

class MetricsWriter {
 public:
  MetricsWriter() = default;  // disabled: write() does nothing
  // Opens (truncates) `path`; throws UsageError naming `flag` when it cannot be written.
  explicit MetricsWriter(const std::string& path, const std::string& flag = "--metrics");
  bool enabled() const { return out_.is_open(); }
  void write(const nlohmann::json& record);  // one line, flushed, so a crash keeps what was written

 private:
  std::ofstream out_;
};

}  // namespace course::metrics
