// JSON-lines writer.
#include "common/metrics/metrics.h"

#include <cerrno>
#include <cstring>

#include "common/core/errors.h"

namespace course::metrics {

MetricsWriter::MetricsWriter(const std::string& path) {
  if (path.empty()) return;
  out_.open(path, std::ios::out | std::ios::trunc);
  if (!out_) throw UsageError(path + ": cannot open for writing (" + std::strerror(errno) + ")");
}

void MetricsWriter::write(const nlohmann::json& record) {
  if (!out_.is_open()) return;
  out_ << record.dump() << '\n';
  out_.flush();
}

}  // namespace course::metrics
