// JSON-lines writer.
#include "common/metrics/metrics.h"

#include <cerrno>
#include <cstring>

#include "common/core/device.h"

namespace course::metrics {

MetricsWriter::MetricsWriter(const std::string& path, const std::string& flag) {
  if (path.empty()) return;
  out_.open(path, std::ios::out | std::ios::trunc);
  if (!out_) throw UsageError(flag + " " + path + ": cannot open for writing (" + std::strerror(errno) + ")");
}

void MetricsWriter::write(const nlohmann::json& record) {
  if (!out_.is_open()) return;
  out_ << record.dump() << '\n';
  out_.flush();
}

}  // namespace course::metrics
