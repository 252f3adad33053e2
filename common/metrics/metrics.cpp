// JSON-lines writer.
#include "common/metrics/metrics.h"

#include <fcntl.h>
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
  const fs::path target(path);
  // Opened once now without truncating, so that what cannot be written is found at start-up (on the
  // rank that writes), and a file that was not there is not left behind empty.
  std::error_code error;
  const bool existed = fs::exists(target, error);
  if (fs::is_directory(target, error)) throw UsageError(path + ": cannot open for writing (a folder)");
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_NONBLOCK, 0644);
  if (fd < 0) throw UsageError(path + ": cannot open for writing (" + std::strerror(errno) + ")");
  ::close(fd);
  if (!existed) fs::remove(target, error);
}

void MetricsWriter::write(const nlohmann::json& record) {
  if (path_.empty()) return;
  if (!out_.is_open()) {
    out_.open(path_, std::ios::out | std::ios::trunc);
    if (!out_) throw std::runtime_error("--metrics: " + path_ + ": cannot open for writing (" + std::strerror(errno) + ")");
    for (const auto& held : before_first_) out_ << held.dump() << '\n';
    before_first_.clear();
  }
  out_ << record.dump() << '\n';
  out_.flush();
  if (!out_) throw std::runtime_error("--metrics: " + path_ + ": the write failed (" + std::strerror(errno) + ")");
}

void MetricsWriter::write_before_first(const nlohmann::json& record) {
  if (path_.empty()) return;
  if (out_.is_open()) return write(record);
  before_first_.push_back(record);
}

}  // namespace course::metrics
