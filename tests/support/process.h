// Runs a chapter binary as a user would, capturing its exit code, stdout and stderr, and reads
// the JSON-lines metrics it wrote.
#pragma once
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

namespace course::testing {

struct ProcessResult {
  int exit_code = -1;
  std::string out, err;
};

inline std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A fresh path in the temporary folder: unique per process and per call, so threads may run processes.
inline std::string temp_path(const std::string& name) {
  static std::atomic<long> counter{0};
  return (std::filesystem::temp_directory_path() /
          (name + "." + std::to_string(::getpid()) + "." + std::to_string(counter++)))
      .string();
}

// A finished command's result from its wait status and the files its output went to (removed).
inline ProcessResult finished(int status, const std::string& out, const std::string& err) {
  ProcessResult r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = read_file(out);
  r.err = read_file(err);
  std::remove(out.c_str());
  std::remove(err.c_str());
  return r;
}

inline ProcessResult run_process(const std::string& command) {
  std::string out = temp_path("course_out"), err = temp_path("course_err");
  return finished(std::system((command + " >" + out + " 2>" + err).c_str()), out, err);
}

// As run_process, and once the command's standard output holds `text`, `then()` (once, on this thread):
// what the test does next waits for the command's own word, never for a clock. When the command ends
// without saying it, `then` is not called.
inline ProcessResult run_process_when(const std::string& command, const std::string& text,
                                      const std::function<void()>& then) {
  std::string out = temp_path("course_out"), err = temp_path("course_err");
  std::atomic<bool> done{false};
  int status = -1;
  std::thread job([&] {
    status = std::system((command + " >" + out + " 2>" + err).c_str());
    done = true;
  });
  for (bool said = false; !done;) {
    if (!said && read_file(out).find(text) != std::string::npos) {
      said = true;
      then();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));  // how often to look, not how long to wait
  }
  job.join();
  return finished(status, out, err);
}

inline std::vector<nlohmann::json> read_metrics(const std::string& path) {
  std::vector<nlohmann::json> records;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) records.push_back(nlohmann::json::parse(line));
  return records;
}

inline std::vector<nlohmann::json> events(const std::vector<nlohmann::json>& records, const std::string& name) {
  std::vector<nlohmann::json> out;
  for (auto& r : records)
    if (r.value("event", "") == name) out.push_back(r);
  return out;
}

inline int count_lines(const std::string& text) {
  int n = 0;
  for (char c : text) n += c == '\n';
  return n;
}

}  // namespace course::testing
