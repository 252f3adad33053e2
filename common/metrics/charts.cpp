// Charts through scripts/plot.py.
#include "common/metrics/charts.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

namespace course::metrics {
namespace {

// A shell word: the text in single quotes, each ' written as '\''.
std::string quoted(const std::string& text) {
  std::string out = "'";
  for (char c : text) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// The first python3 that imports matplotlib (Debian's, when the default python3 is another one).
std::string python_with_matplotlib() {
  for (const char* python : {"python3", "/usr/bin/python3"})
    if (std::system((std::string(python) + " -c 'import matplotlib' >/dev/null 2>&1").c_str()) == 0) return python;
  return "";
}

}  // namespace

// Runs plot.py with `arguments` (already quoted); false with `why` when it could not.
static bool plot(const std::string& arguments, const std::string& what, std::string* why) {
  const std::string python = python_with_matplotlib();
  if (python.empty()) {
    *why = "no python3 with matplotlib (scripts/setup.sh installs it)";
    return false;
  }
  if (std::system((python + " " + quoted(COURSE_PLOT_SCRIPT) + " " + arguments + " >/dev/null 2>&1").c_str()) != 0) {
    *why = "scripts/plot.py " + what + " failed (is the output's folder writable?)";
    return false;
  }
  return true;
}

bool draw_timeline(const std::string& trace, const std::string& png, std::string* why) {
  return plot("timeline " + quoted(trace) + " " + quoted(png), "timeline", why);
}

bool draw_charts(const std::string& kind, const std::vector<nlohmann::json>& records, const std::string& prefix,
                 std::string* why) {
  const auto file = std::filesystem::temp_directory_path() / ("course_charts_" + std::to_string(::getpid()) + ".jsonl");
  {
    std::ofstream out(file);
    for (const auto& r : records) out << r.dump() << "\n";
  }
  const bool drawn = plot(quoted(kind) + " " + quoted(file.string()) + " " + quoted(prefix), kind, why);
  std::filesystem::remove(file);
  return drawn;
}

}  // namespace course::metrics
