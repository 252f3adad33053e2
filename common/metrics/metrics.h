// Metrics as JSON lines (one object per line), the format scripts/plot.py reads.
#pragma once
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

namespace course::metrics {

class MetricsWriter {
 public:
  MetricsWriter() = default;  // disabled: write() does nothing
  // Opens (truncates) `path`; an empty path writes nothing. Throws UsageError when it cannot be written.
  explicit MetricsWriter(const std::string& path);
  MetricsWriter(MetricsWriter&&) = default;
  MetricsWriter& operator=(MetricsWriter&&) = default;
  bool enabled() const { return out_.is_open(); }
  void write(const nlohmann::json& record);  // one line, flushed, so a crash keeps what was written

 private:
  std::ofstream out_;
};

}  // namespace course::metrics
