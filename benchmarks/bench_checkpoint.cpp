// Checkpoint write and read speed against the disk's own: the same number of bytes written with
// write() and one fsync (what `dd bs=8M conv=fsync` does), side by side with the course's atomic
// safetensors writer (checksum, temporary file, fsync, rename, fsync of the folder), alternating, so a
// noisy disk affects both alike. Reads twice: cold, each file's pages first dropped from the page cache
// (posix_fadvise DONTNEED, which needs no privilege), so both come from the disk; then warm, from the
// page cache, as a resume right after a save reads. Its files live in a folder of its own that it makes
// in --dir (mkdtemp) and removes at the end, so it never touches a file it did not make.
//   bench_checkpoint [--mb 100] [--repeats 7] [--dir the temp folder] [--metrics FILE]
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <CLI/CLI.hpp>

#include "common/checkpoint/safetensors.h"
#include "common/cli/cli.h"
#include "common/metrics/metrics.h"

using namespace course;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point begin) { return std::chrono::duration<double>(Clock::now() - begin).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// A training checkpoint's shape: parameters, and Adam's two moments for each (three equal thirds).
checkpoint::NamedTensors model_of(double megabytes) {
  const auto floats = static_cast<std::int64_t>(megabytes * 1e6 / 4);
  const std::int64_t per_tensor_max = 1 << 20;
  const std::int64_t layers = std::max<std::int64_t>(1, (floats + 3 * per_tensor_max - 1) / (3 * per_tensor_max));
  const std::int64_t per_tensor = std::max<std::int64_t>(1, floats / (3 * layers));
  checkpoint::NamedTensors tensors;
  for (std::int64_t i = 0; i < layers; ++i) {
    const std::string name = std::to_string(i) + ".weight";
    tensors.emplace_back(name, Tensor::randn({per_tensor}, static_cast<std::uint64_t>(3 * i)));
    tensors.emplace_back("optimizer." + std::to_string(i) + ".exp_avg", Tensor::randn({per_tensor}, 3 * i + 1));
    tensors.emplace_back("optimizer." + std::to_string(i) + ".exp_avg_sq", Tensor::randn({per_tensor}, 3 * i + 2));
  }
  return tensors;
}

// write() in 8 MiB blocks, then fsync: the disk's speed as dd conv=fsync measures it.
double raw_write(const std::string& path, const std::vector<char>& bytes) {
  const auto begin = Clock::now();
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) throw UsageError("--dir: cannot write " + path);
  for (std::size_t at = 0; at < bytes.size();) {
    const ssize_t n = ::write(fd, bytes.data() + at, std::min<std::size_t>(8 << 20, bytes.size() - at));
    if (n <= 0) throw std::runtime_error("write to " + path + " failed");
    at += static_cast<std::size_t>(n);
  }
  ::fsync(fd);
  ::close(fd);
  return seconds_since(begin);
}

// The file's pages out of the page cache (written back first), so that the next read meets the disk.
void drop_from_cache(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw std::runtime_error("cannot open " + path);
  ::fdatasync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

double raw_read(const std::string& path, std::vector<char>& into) {
  const auto begin = Clock::now();
  std::ifstream in(path, std::ios::binary);
  in.read(into.data(), static_cast<std::streamsize>(into.size()));
  return seconds_since(begin);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Checkpoint write and read throughput against the disk's raw write + fsync"};
  double megabytes = 100;
  int repeats = 7;
  std::string dir = std::filesystem::temp_directory_path().string(), metrics_path;
  app.add_option("--mb", megabytes, "Checkpoint size in MB (parameters and Adam state)")
      ->check(cli::PositiveFinite & CLI::Range(0.001, 100000.0))
      ->capture_default_str();
  app.add_option("--repeats", repeats, "Measurements of each, alternating")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  app.add_option("--dir", dir, "Folder on the disk being measured: the files go in a folder of their own made there, "
                               "removed at the end (a /tmp in memory measures memory)")
      ->check(CLI::ExistingDirectory)
      ->capture_default_str();
  app.add_option("--metrics", metrics_path, "Append the result as a JSON line to FILE");
  return cli::run(app, argc, argv, [&] {
    metrics::MetricsWriter metrics(metrics_path);
    const auto tensors = model_of(megabytes);
    std::string own = (std::filesystem::path(dir) / "bench_checkpoint.XXXXXX").string();
    if (!::mkdtemp(own.data())) throw UsageError("--dir: cannot make a folder in " + dir + ": " + std::strerror(errno));
    struct Removed {
      std::filesystem::path folder;
      ~Removed() {
        std::error_code ignored;
        std::filesystem::remove_all(folder, ignored);
      }
    } removed{own};
    const std::string ckpt = (std::filesystem::path(own) / "checkpoint.safetensors").string();
    const std::string raw = (std::filesystem::path(own) / "raw.bin").string();
    checkpoint::save_safetensors(ckpt, tensors, {{"step", "0"}});  // warm-up, and the file size
    const auto bytes = static_cast<std::size_t>(std::filesystem::file_size(ckpt));
    std::vector<char> buffer(bytes, '\x5a');
    std::vector<double> raw_w, ckpt_w, raw_r, ckpt_r, raw_cold, ckpt_cold;
    bool identical = true;
    const auto time_load = [&](std::vector<double>& into) {
      const auto begin = Clock::now();
      auto loaded = checkpoint::load_safetensors(ckpt);
      into.push_back(seconds_since(begin));
      for (std::size_t i = 0; i < tensors.size(); ++i)
        identical = identical && loaded.tensors[i].second.to_host() == tensors[i].second.to_host();
    };
    for (int r = 0; r < repeats; ++r) {
      // Alternate which goes first, so neither always meets the disk right after the other's flush.
      auto time_raw = [&] { raw_w.push_back(raw_write(raw, buffer)); };
      auto time_ckpt = [&] {
        const auto begin = Clock::now();
        checkpoint::save_safetensors(ckpt, tensors, {{"step", std::to_string(r)}});
        ckpt_w.push_back(seconds_since(begin));
      };
      if (r % 2 == 0) {
        time_raw();
        time_ckpt();
      } else {
        time_ckpt();
        time_raw();
      }
      raw_r.push_back(raw_read(raw, buffer));
      time_load(ckpt_r);
    }
    // Cold reads after the writes, not between them: reading from the disk just before a write slowed
    // the next checkpoint write (median 0.57 of the raw write against 0.98 without, 2026-11-29).
    for (int r = 0; r < repeats; ++r) {
      drop_from_cache(raw);
      drop_from_cache(ckpt);
      if (r % 2 == 0) {
        raw_cold.push_back(raw_read(raw, buffer));
        time_load(ckpt_cold);
      } else {
        time_load(ckpt_cold);
        raw_cold.push_back(raw_read(raw, buffer));
      }
    }
    const double mb = static_cast<double>(bytes) / 1e6;
    const double w_raw = mb / median(raw_w), w_ckpt = mb / median(ckpt_w);
    const double r_raw = mb / median(raw_r), r_ckpt = mb / median(ckpt_r);
    const double c_raw = mb / median(raw_cold), c_ckpt = mb / median(ckpt_cold);
    std::printf("checkpoint of %.1f MB (%zu tensors) in %s, median of %d, alternating (the ratio's spread: "
                "the fastest and slowest repeat's ratio):\n", mb, tensors.size(), dir.c_str(), repeats);
    // Each repeat's own ratio (the two measured side by side), the least and the most of them.
    const auto spread = [](const std::vector<double>& raw_s, const std::vector<double>& ckpt_s) {
      std::vector<double> ratios;
      for (std::size_t i = 0; i < raw_s.size(); ++i) ratios.push_back(raw_s[i] / ckpt_s[i]);
      return std::make_pair(*std::min_element(ratios.begin(), ratios.end()), *std::max_element(ratios.begin(), ratios.end()));
    };
    const auto line = [&](const char* what, double raw_rate, double ckpt_rate, const std::vector<double>& raw_s,
                          const std::vector<double>& ckpt_s) {
      const auto [least, most] = spread(raw_s, ckpt_s);
      std::printf("  %-38s %8.0f MB/s   checkpoint %8.0f MB/s   ratio %.2f (%.2f-%.2f)\n", what, raw_rate, ckpt_rate,
                  ckpt_rate / raw_rate, least, most);
    };
    line("write  raw write+fsync (dd conv=fsync)", w_raw, w_ckpt, raw_w, ckpt_w);
    line("read   raw read (from the disk, cold)", c_raw, c_ckpt, raw_cold, ckpt_cold);
    line("read   raw read (page cache)", r_raw, r_ckpt, raw_r, ckpt_r);
    std::printf("  checkpoint write %.1f ms, read and validate %.1f ms; round trip bit-identical: %s\n",
                1000 * median(ckpt_w), 1000 * median(ckpt_r), identical ? "yes" : "NO");
    metrics.write({{"event", "checkpoint_io"},
                   {"mb", mb},
                   {"repeats", repeats},
                   {"raw_write_mb_per_s", w_raw},
                   {"checkpoint_write_mb_per_s", w_ckpt},
                   {"write_ratio", w_ckpt / w_raw},
                   {"raw_read_mb_per_s", r_raw},
                   {"checkpoint_read_mb_per_s", r_ckpt},
                   {"read_ratio", r_ckpt / r_raw},
                   {"raw_cold_read_mb_per_s", c_raw},
                   {"checkpoint_cold_read_mb_per_s", c_ckpt},
                   {"cold_read_ratio", c_ckpt / c_raw},
                   {"checkpoint_write_ms", 1000 * median(ckpt_w)},
                   {"identical", identical}});
    return identical ? 0 : 1;
  });
}
