// One background thread per process checks the collectives in flight ten times a second.
#include "common/comm/watchdog.h"

#include <mpi.h>

#include <condition_variable>
#include <cstdio>
#include <map>
#include <mutex>
#include <thread>

namespace course::comm {
namespace {

struct Entry {
  std::string operation;
  long sequence;
  int rank;
  std::chrono::steady_clock::time_point deadline;
  std::chrono::milliseconds timeout;
};

class Watchdog {
 public:
  static Watchdog& instance() {
    static Watchdog* w = new Watchdog;  // never joined: the thread lives as long as the process
    return *w;
  }
  std::uint64_t begin(Entry e) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });
    entries_[++next_id_] = std::move(e);
    return next_id_;
  }
  void end(std::uint64_t id) {
    std::lock_guard<std::mutex> lock(mutex_);
    entries_.erase(id);
  }

 private:
  void loop() {
    for (;;) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      std::lock_guard<std::mutex> lock(mutex_);
      auto now = std::chrono::steady_clock::now();
      for (auto& [id, e] : entries_) {
        if (now < e.deadline) continue;
        std::fprintf(stderr,
                     "watchdog: rank %d: collective %s #%ld has not finished after %.1f s; aborting the job "
                     "(a rank may have skipped, reordered or mismatched a collective)\n",
                     e.rank, e.operation.c_str(), e.sequence, static_cast<double>(e.timeout.count()) / 1000.0);
        std::fflush(stderr);
        MPI_Abort(MPI_COMM_WORLD, 3);
        std::_Exit(3);
      }
    }
  }
  std::mutex mutex_;
  std::thread thread_;
  std::map<std::uint64_t, Entry> entries_;
  std::uint64_t next_id_ = 0;
};

}  // namespace

std::uint64_t watchdog_begin(const std::string& operation, long sequence, int rank, std::chrono::milliseconds timeout) {
  return Watchdog::instance().begin({operation, sequence, rank, std::chrono::steady_clock::now() + timeout, timeout});
}

void watchdog_end(std::uint64_t id) { Watchdog::instance().end(id); }

}  // namespace course::comm
