// JSON-lines writer.
#include "common/metrics/metrics.h"

#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <stdexcept>
#include <cstring>

#include "common/core/errors.h"

namespace course::metrics {

MetricsWriter::MetricsWriter(const std::string& path) : path_(path) {
  if (path.empty()) return;
  namespace fs = std::filesystem;
  const fs::path target(path), folder = target.has_parent_path() ? target.parent_path() : fs::path(".");
  std::error_code error;
  const bool writable = fs::exists(target, error) ? ::access(path.c_str(), W_OK) == 0 && !fs::is_directory(target, error)
                                                  : ::access(folder.c_str(), W_OK | X_OK) == 0;
  if (!writable) throw UsageError(path + ": cannot be written (" + std::strerror(errno) + ")");
}

void MetricsWriter::write(const nlohmann::json& record) {
  if (path_.empty()) return;
  if (!out_.is_open()) {
    out_.open(path_, std::ios::out | std::ios::trunc);
    if (!out_) throw std::runtime_error("--metrics: " + path_ + ": cannot open for writing (" + std::strerror(errno) + ")");
  }
  out_ << record.dump() << '\n';
  out_.flush();
  if (!out_) throw std::runtime_error("--metrics: " + path_ + ": the write failed (" + std::strerror(errno) + ")");
}

}  // namespace course::metrics
