// Common flags, validators and the error-to-exit-code policy.
#include "common/cli/cli.h"

#include "common/core/cpu_cores.h"

#include <CLI/CLI.hpp>

#include <cmath>
#include <cstdio>
#include <cctype>
#include <cstdlib>
#include <new>
#include <filesystem>
#include <climits>
#include <unistd.h>
#include <string>

#include <mpi.h>

#include "common/checkpoint/parameters.h"
#include "common/comm/environment.h"
#include "common/comm/simulated_network.h"
#include "common/core/cpu_allocator.h"  // keep_freed_host_memory
#include "common/core/log.h"
#include "common/core/device.h"
#include "common/core/output_folder.h"
#include "common/faults/faults.h"
#include "common/kernels/kernels.h"

namespace course::cli {

const CLI::Validator OutputFile(
    [](std::string& input) -> std::string {
      namespace fs = std::filesystem;
      const fs::path target(input);
      const fs::path folder = target.has_parent_path() ? target.parent_path() : fs::path(".");
      std::error_code error;
      if (target.filename().empty() || fs::is_directory(target, error)) return input + ": is a folder, not a file name";
      // Nothing is written through a link (where it points is not the run's to choose); /dev/stdout and a
      // shell's /dev/fd/N are links the user means.
      if (fs::is_symlink(fs::symlink_status(target, error)) && input.rfind("/dev/", 0) != 0)
        return input + ": is a link, and a run never writes through one; name the file itself";
      if (target.filename().string().size() > static_cast<std::size_t>(NAME_MAX))
        return input + ": the file name is longer than the " + std::to_string(NAME_MAX) + " characters it may have";
      if (const std::string problem = output_folder_problem(folder); !problem.empty()) return input + ": " + problem;
      if (fs::exists(target, error) && ::access(target.c_str(), W_OK) != 0) return input + ": is not writable";
      // A named pipe blocks the writer until something reads it: refused, where /dev/stdout and a shell's
      // /dev/fd/N (process substitution, read already) are not.
      if (fs::is_fifo(target, error) && input.rfind("/dev/", 0) != 0)
        return input + ": is a named pipe, which would hold the run until something reads it; give a file";
      return {};
    },
    "FILE", "");

const CLI::Validator InputFile(
    [](std::string& input) -> std::string {
      namespace fs = std::filesystem;
      std::error_code error;
      const fs::file_status status = fs::status(input, error);
      if (!fs::exists(status)) return input + ": no such file";
      if (fs::is_directory(status)) return input + ": is a folder, not a file";
      // A shell's process substitution (/dev/fd/N) has its writer already; a named pipe elsewhere may never.
      if (!fs::is_regular_file(status) && input.rfind("/dev/", 0) != 0)
        return input + ": is not a regular file (a named pipe or a device); give a file";
      if (::access(input.c_str(), R_OK) != 0) return input + ": cannot be read";
      return {};
    },
    "FILE", "");

void add_common_options(CLI::App& app, CommonOptions& o) {
  app.add_option("--device", o.device, "Where to run: auto (CUDA when a GPU is usable), cpu or cuda")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}))->capture_default_str();
  app.add_option("--seed", o.seed, "Seed for data and initial weights")->check(Seed)->capture_default_str();
  app.add_option("--metrics", o.metrics, "Write metrics to this file as JSON lines")->check(OutputFile);
}

namespace {
// A validator from a check that throws UsageError: its message is the flag's verdict.
CLI::Validator usage_checked(void (*check)(const std::string&), const std::string& name) {
  return CLI::Validator(
      [check](std::string& input) -> std::string {
        try {
          check(input);
        } catch (const UsageError& e) {
          return e.what();
        }
        return {};
      },
      name, "");
}
}  // namespace

void add_save_option(CLI::App& app, std::string& path) {
  app.add_option("--save", path, "Write the final parameters to this file (safetensors)")
      ->check(usage_checked([](const std::string& input) { checkpoint::check_writable(input); }, "FILE"));
}

void add_sim_network_option(CLI::App& app, std::string& text) {
  app.add_option("--sim-network", text, "Delay every message as on a network of ALPHA_US,GBPS (10,1.25 is 10 GbE)")
      ->check(usage_checked([](const std::string& input) { comm::parse_network(input); }, "ALPHA_US,GBPS"));
}

void add_distributed_options(CLI::App& app, DistributedOptions& o) {
  app.add_option("--backend", o.backend, "Communication: auto (NCCL when every rank has its own GPU), mpi or nccl")
      ->check(CLI::IsMember({"auto", "mpi", "nccl"}))->capture_default_str();
  app.add_option("--timeout", o.timeout, "Seconds a collective may take before the watchdog aborts the job")
      ->check(PositiveFinite)->capture_default_str();
  app.add_flag_callback("--verbose", [] { set_log_rank(log_rank(), true); },
                        "Every rank logs (prefixed with its rank), not only rank 0");
}

void add_verify_options(CLI::App& app, bool& verify, const std::string& checks, FaultOptions& o,
                        const std::vector<std::pair<std::string, std::string>>& faults) {
  app.add_flag("--verify", verify, "Check every step in lock-step: " + checks);
  std::vector<std::string> names{"none"};
  std::string help = "Break the run on purpose, to see --verify catch it: none";
  for (const auto& [name, what] : faults) {
    names.push_back(name);
    help += "; " + name + " (" + what + ")";
  }
  app.add_option("--fault", o.fault, help)->check(CLI::IsMember(names))->capture_default_str();
  app.add_option("--fault-from-step", o.from_step, "The step at which --fault begins (0: the first)")
      ->check(CLI::Range(std::int64_t{0}, std::int64_t{1} << 40))->capture_default_str();
}

void arm_faults(const FaultOptions& o, bool verify, std::int64_t steps) {
  if (o.from_step > 0 && o.fault == "none") throw UsageError("--fault-from-step: needs --fault, the fault to begin");
  if (o.fault != "none" && o.from_step >= steps)
    throw UsageError("--fault-from-step: step " + std::to_string(o.from_step) + " is never reached in " +
                     std::to_string(steps) + " steps (--steps)");
  if (o.fault != "none" && !verify) throw UsageError("--fault: a fault is for --verify to catch; add --verify");
  faults::arm(o.fault, o.from_step);
}

// [+-]? (digits [. digits?] | . digits) ([eE] [+-]? digits)?, scanned by hand: std::regex would cost
// every build seconds of compiling for two patterns.
bool decimal_number(const std::string& text) {
  std::size_t i = 0;
  const auto sign = [&] { if (i < text.size() && (text[i] == '+' || text[i] == '-')) ++i; };
  const auto digits = [&] {
    const std::size_t from = i;
    while (i < text.size() && text[i] >= '0' && text[i] <= '9') ++i;
    return i - from;
  };
  sign();
  std::size_t mantissa = digits();
  if (i < text.size() && text[i] == '.') ++i, mantissa += digits();
  if (mantissa == 0) return false;
  if (i < text.size() && (text[i] == 'e' || text[i] == 'E')) {
    ++i;
    sign();
    if (digits() == 0) return false;
  }
  return i == text.size();
}

namespace {
CLI::Validator number_rule(const std::string& description, bool integer, bool allow_zero) {
  return CLI::Validator(
      [=](std::string& input) -> std::string {
        try {
          std::size_t used = 0;
          double value = integer ? static_cast<double>(std::stoll(input, &used)) : std::stod(input, &used);
          if (used == input.size() && decimal_number(input) && std::isfinite(value) && value >= 0.0 &&
              (allow_zero || value != 0.0))
            return {};
        } catch (const std::exception&) {
        }
        // Thrown, not returned: a range checked beside this rule (PositiveInteger & CLI::Range) then adds
        // nothing to the message, which CLI11 would join with " AND " to the range's verdict on the same text.
        throw CLI::ValidationError("must be " + description + ", got '" + input + "'");
      },
      description, description);
}
}  // namespace

const CLI::Validator PositiveInteger = number_rule("a positive integer", true, false);
// Digits only, and at most 2^64 - 1: CLI11 would wrap "-1" and saturate "99999999999999999999".
const CLI::Validator Seed(
    [](std::string& input) -> std::string {
      const bool digits = !input.empty() && input.size() <= 20 &&
                          input.find_first_not_of("0123456789") == std::string::npos;
      if (digits && (input.size() < 20 || input <= "18446744073709551615")) return {};
      return "must be a whole number from 0 to 18446744073709551615, got '" + input + "'";
    },
    "a whole number from 0 to 2^64-1", "");
const CLI::Validator PositiveFinite = number_rule("a positive finite number", false, false);
const CLI::Validator NonNegativeFinite = number_rule("a non-negative finite number", false, true);

namespace {
// Every rank reads the same flags and fails alike; rank 0 alone says so (even with --verbose), then the
// ranks meet and leave together (comm::meet_before_leaving). A rank the others never met failed alone:
// it says so itself and ends the job.
int report_and_leave(const std::string& message, int code) {
  if (log_rank() == 0) {
    std::fprintf(stderr, "error: %s\n", message.c_str());
    std::fflush(stderr);
  }
  if (comm::meet_before_leaving()) return code;
  if (log_rank() != 0) std::fprintf(stderr, "error: rank %d: %s\n", log_rank(), message.c_str());
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, code);
  return code;
}

// An empty value ("--seed ''") is never what a user meant: CLI11 would read it as 0 or as "none".
const CLI::Validator NotEmpty(
    [](std::string& input) -> std::string { return input.empty() ? "must not be empty" : std::string(); }, "", "");
}  // namespace

// Integer flags are decimal, as their help says. CLI11 reads a leading 0 as octal and 0x as hex
// (--steps 010 would run 8 steps): leading zeros are dropped ("010" is ten), and another base is refused.
const CLI::Validator Decimal(
    [](std::string& input) -> std::string {
      std::size_t digits = input.empty() || (input[0] != '-' && input[0] != '+') ? 0 : 1;
      // Decimal digits only: "4 " and "3.0" are refused as what they are, not as out of a range.
      if (input.size() == digits || input.find_first_not_of("0123456789", digits) != std::string::npos)
        return "must be a whole number in decimal digits, got '" + input + "'";
      if (input.size() > digits + 1 && input[digits] == '0') {
        const std::size_t first = input.find_first_not_of('0', digits);
        input.erase(digits, (first == std::string::npos ? input.size() - 1 : first) - digits);
      }
      return {};
    },
    "", "");

namespace {
struct InertRule {
  const CLI::App* app;
  std::string flag;
  std::function<std::string()> why_inert;
};
std::vector<InertRule>& inert_rules() {
  static std::vector<InertRule> rules;
  return rules;
}
}  // namespace

void refuse_inert(CLI::App& app, const std::string& flag, std::function<std::string()> why_inert) {
  inert_rules().push_back({&app, flag, std::move(why_inert)});
}

int run(CLI::App& app, int argc, char** argv, const std::function<int()>& body) {
  cpu_allocator::keep_freed_host_memory();
  try {
    for (CLI::Option* option : app.get_options()) {
      if (option->get_items_expected_min() > 0) option->check(NotEmpty);
      const std::string type = option->get_type_name();
      if (type.rfind("INT", 0) == 0 || type.rfind("UINT", 0) == 0) option->transform(Decimal);
    }
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    if (is_log_rank()) std::printf("%s", app.help().c_str());
    return 0;
  } catch (const CLI::CallForAllHelp&) {
    std::printf("%s", app.help("", CLI::AppFormatMode::All).c_str());
    return 0;
  } catch (const CLI::ArgumentMismatch& e) {  // CLI11 says "--steps: At Most 1 required but received 2"
    const std::string what = e.what(), said = ": At Most 1 required but received ";
    const std::size_t at = what.find(said);
    const std::string flag = what.substr(0, at), times = at == std::string::npos ? "" : what.substr(at + said.size());
    const bool twice = !flag.empty() && flag.find_first_of(" \t\n") == std::string::npos && !times.empty() &&
                       times.find_first_not_of("0123456789") == std::string::npos;
    return report_and_leave(twice ? flag + ": given " + times + " times; give it once" : what, 2);
  } catch (const CLI::ParseError& e) {
    return report_and_leave(e.what(), 2);
  }
  try {
    for (const InertRule& rule : inert_rules())
      if (rule.app == &app && app.count(rule.flag) > 0)
        if (const std::string why = rule.why_inert(); !why.empty()) throw UsageError(rule.flag + ": " + why);
    return body();
  } catch (const ReportedError& e) {
    if (!comm::meet_before_leaving()) MPI_Abort(MPI_COMM_WORLD, e.code);
    return e.code;
  } catch (const UsageError& e) {
    return report_and_leave(e.what(), 2);
  } catch (const SharedError& e) {
    return report_and_leave(e.what(), 1);
  } catch (const std::exception& caught) {
    const bool memory = dynamic_cast<const std::bad_alloc*>(&caught) != nullptr;
    const std::string message = memory ? "out of memory (a size flag may be too large for this machine)" : caught.what();
    int initialized = 0, finalized = 0, ranks = 1;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (initialized && !finalized) MPI_Comm_size(MPI_COMM_WORLD, &ranks);
    if (ranks == 1) {
      if (log_rank() == 0) std::fprintf(stderr, "error: %s\n", message.c_str());
      return 1;
    }
    std::fprintf(stderr, "error: rank %d: %s\n", log_rank(), message.c_str());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
    return 1;
  }
}

Program::Program(const std::string& description) : app_(std::make_unique<CLI::App>(description)) {}
Program::~Program() = default;
int Program::run(int argc, char** argv, const std::function<int()>& body) { return cli::run(*app_, argc, argv, body); }

std::size_t parse_bytes(const std::string& text, const std::string& flag, std::size_t multiple, std::size_t limit) {
  const std::string usage = flag + ": '" + text + "' is not a size (use e.g. 8, 1K, 64M)";
  std::size_t digits = 0;
  while (digits < text.size() && std::isdigit(static_cast<unsigned char>(text[digits]))) ++digits;
  const std::string suffix = text.substr(digits);
  const std::size_t scale = suffix.empty() ? 1 : suffix == "K" ? 1ul << 10 : suffix == "M" ? 1ul << 20
                                                : suffix == "G" ? 1ul << 30 : 0;
  if (digits == 0 || digits > 15 || scale == 0) throw UsageError(usage);
  const std::size_t value = std::stoull(text.substr(0, digits));  // at most 15 digits: no overflow
  if (value == 0 || value > limit / scale)
    throw UsageError(flag + ": " + text + " must be between 1 and " + std::to_string(limit) + " bytes");
  const std::size_t bytes = value * scale;
  if (bytes % multiple != 0)
    throw UsageError(flag + ": " + text + " must be a multiple of " + std::to_string(multiple) + " bytes");
  return bytes;
}

void configure_cpu_threads(int ranks_on_this_machine) { place_cpu_threads(ranks_on_this_machine); }

}  // namespace course::cli
