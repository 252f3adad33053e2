// JSON-lines writer.
#include "common/metrics/metrics.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <cstring>
#include <stdexcept>
#include <utility>

#include "common/core/errors.h"

namespace course::metrics {

namespace {
// Nothing is written through a link, except /dev/stdout and a shell's /dev/fd/N, which the user means.
int no_follow(const std::string& path) { return path.rfind("/dev/", 0) == 0 ? 0 : O_NOFOLLOW; }
}  // namespace

MetricsWriter::MetricsWriter(const std::string& path) : path_(path) {
  if (path.empty()) return;
  namespace fs = std::filesystem;
  const fs::path target(path);
  // Opened once now without truncating, so that what cannot be written is found at start-up (on the
  // rank that writes), and a file that was not there is not left behind empty.
  std::error_code error;
  const bool existed = fs::exists(target, error);
  if (fs::is_directory(target, error)) throw UsageError(path + ": cannot open for writing (a folder)");
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_NONBLOCK | no_follow(path), 0644);
  if (fd < 0) throw UsageError(path + ": cannot open for writing (" + std::strerror(errno) + ")");
  ::close(fd);
  if (!existed) fs::remove(target, error);
}

MetricsWriter::MetricsWriter(MetricsWriter&& other) noexcept
    : path_(std::move(other.path_)), out_(std::exchange(other.out_, nullptr)), before_first_(std::move(other.before_first_)) {
  other.path_.clear();
}

MetricsWriter& MetricsWriter::operator=(MetricsWriter&& other) noexcept {
  if (this != &other) {
    if (out_) std::fclose(out_);
    path_ = std::exchange(other.path_, std::string());
    out_ = std::exchange(other.out_, nullptr);
    before_first_ = std::move(other.before_first_);
  }
  return *this;
}

MetricsWriter::~MetricsWriter() {
  if (out_) std::fclose(out_);
}

void MetricsWriter::write(const nlohmann::json& record) {
  if (path_.empty()) return;
  if (!out_) {
    // Opened without following a link: one put there since start-up is refused, not written through.
    const int fd = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | no_follow(path_), 0644);
    if (fd < 0 || !(out_ = ::fdopen(fd, "w"))) {
      const std::string why = std::strerror(errno);
      if (fd >= 0) ::close(fd);
      throw std::runtime_error("--metrics: " + path_ + ": cannot open for writing (" + why + ")");
    }
    for (const auto& held : before_first_) std::fputs((held.dump() + '\n').c_str(), out_);
    before_first_.clear();
  }
  const std::string line = record.dump() + '\n';
  if (std::fputs(line.c_str(), out_) < 0 || std::fflush(out_) != 0)
    throw std::runtime_error("--metrics: " + path_ + ": the write failed (" + std::strerror(errno) + ")");
}

void MetricsWriter::write_before_first(const nlohmann::json& record) {
  if (path_.empty()) return;
  if (out_) return write(record);
  before_first_.push_back(record);
}

}  // namespace course::metrics
