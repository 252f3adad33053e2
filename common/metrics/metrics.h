// Metrics as JSON lines (one object per line), the format scripts/plot.py reads.
#pragma once
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace course::metrics {

class MetricsWriter {
 public:
  MetricsWriter() = default;  // disabled: write() does nothing
  // Writes to `path` (an empty path: nothing), which is opened, and so truncated, at the first record:
  // a run stopped by a usage error before it wrote anything leaves an existing file as it was. Throws
  // UsageError when `path` cannot be written. Never through a link (outside /dev: /dev/stdout is one).
  explicit MetricsWriter(const std::string& path);
  MetricsWriter(MetricsWriter&& other) noexcept;
  MetricsWriter& operator=(MetricsWriter&& other) noexcept;
  ~MetricsWriter();
  bool enabled() const { return !path_.empty(); }
  // One line, flushed, so a crash keeps what was written. A write that fails (a full disk) throws
  // std::runtime_error naming the file: a run whose record is lost does not pass.
  void write(const nlohmann::json& record);
  // A record of the set-up (the cores a run got, say), written just before the first record: a run stopped
  // by a usage error still leaves an existing file as it was.
  void write_before_first(const nlohmann::json& record);

 private:
  std::string path_;
  std::FILE* out_ = nullptr;  // opened at the first record
  std::vector<nlohmann::json> before_first_;
};

}  // namespace course::metrics
