// Command-line handling shared by every chapter: the common flags, validators, and the exit codes
// (0 success, 1 a failed check or runtime error, 2 a usage error named in one line).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/cli/forward.h"

#include "common/core/errors.h"

namespace course::cli {

struct CommonOptions {
  std::string device = "auto";  // --device auto|cpu|cuda
  std::uint64_t seed = 42;      // --seed
  std::string metrics;          // --metrics FILE (JSON lines); empty means none
};
void add_common_options(CLI::App& app, CommonOptions& options);

// --save FILE: the training chapters write their final parameters there (safetensors). The path is
// checked when the flags are read.
void add_save_option(CLI::App& app, std::string& path);

// --sim-network ALPHA_US,GBPS: every collective delayed as on that network (comm/simulated_network.h),
// checked when the flags are read.
void add_sim_network_option(CLI::App& app, std::string& text);

// The flags every multi-rank chapter adds; --verbose makes every rank log, not only rank 0.
struct DistributedOptions {
  std::string backend = "auto";  // --backend auto|mpi|nccl
  double timeout = 300;          // --timeout: seconds before the watchdog aborts a stuck collective
};
void add_distributed_options(CLI::App& app, DistributedOptions& options);

// --fault F and --fault-from-step K: the chapter breaks its own computation on purpose, from step K on
// (0: from the first), so that --verify can be seen, and tested, to catch a fault that begins at any step.
struct FaultOptions {
  std::string fault = "none";
  std::int64_t from_step = 0;
};
// --verify, the chapter's lock-step check (`checks`: what it checks every step, for the help), with
// --fault and --fault-from-step: `faults` are the chapter's faults besides "none", each with what it breaks.
void add_verify_options(CLI::App& app, bool& verify, const std::string& checks, FaultOptions& options,
                        const std::vector<std::pair<std::string, std::string>>& faults);
// Arms the run's fault (common/faults/faults.h) once its flags hold: a UsageError for --fault without
// --verify (nothing would catch it: the run would train wrong and end PASSED), for --fault-from-step
// without a fault, or at a step a run of `steps` steps never reaches.
void arm_faults(const FaultOptions& options, bool verify, std::int64_t steps);

// Thrown once the error has been printed (by the rank that saw it): run() returns `code` quietly.
struct ReportedError {
  int code;
};

// "64M" -> 67108864: a byte count with an optional K, M or G suffix, positive, a multiple of
// `multiple`, and at most `limit`; a UsageError naming `flag` otherwise.
std::size_t parse_bytes(const std::string& text, const std::string& flag, std::size_t multiple = 1,
                        std::size_t limit = std::size_t{1} << 40);

// An output file a flag names (--metrics, --trace, a --charts prefix): not a folder, a name the file
// system allows, in a folder that exists and can be written; a file already there must be writable (a
// device such as /dev/stdout may be; a named pipe outside /dev may not). Checked when the flags are read,
// on every rank alike, so a bad path
// stops the job before any work instead of after it.
extern const CLI::Validator OutputFile;

// An input file a flag names (a calibration, a link's fit, a model to start from): a regular file that
// exists and can be read; a folder, or a named pipe outside /dev (which would hold the run until something
// writes it; a shell's /dev/fd/N has its writer), is refused, naming it.
extern const CLI::Validator InputFile;

// Whether `text` is a number in decimal notation (digits, at most one point, an optional exponent), as
// every numeric flag is written: strtod also reads C's hexadecimal forms ("0x10" is 16, "0x1p16"), which
// a reader of the command line would not take for numbers.
bool decimal_number(const std::string& text);

// Validators whose messages name the rule that was broken.
extern const CLI::Validator PositiveInteger;  // >= 1
extern const CLI::Validator PositiveFinite;   // > 0 and not NaN or infinite, in decimal notation
extern const CLI::Validator NonNegativeFinite;
extern const CLI::Validator Seed;             // 0 .. 2^64-1, digits only

// A flag that does nothing in some combination of the others is refused, not ignored: once the flags
// are parsed, if `flag` was given and `why_inert()` returns a reason (empty: the flag acts), cli::run
// stops with "flag: reason" and exit code 2, before any work. The reason names the other flag and its
// value, e.g. "does nothing without --precision fp16 (--precision is bf16)".
void refuse_inert(CLI::App& app, const std::string& flag, std::function<std::string()> why_inert);

// Parses the flags and runs `body`. --help prints the help and returns 0; a parse error or a
// UsageError prints "error: <message>" on one line (rank 0) and returns 2. Any other exception is
// printed by the rank that raised it; under mpirun with several ranks that rank then aborts the
// whole job (exit code 1), so the others never wait for it in a collective.
int run(CLI::App& app, int argc, char** argv, const std::function<int()>& body);

// A chapter's command line: its description, the flags its option groups add to app(), and run() as
// above. The CLI11 app is built in cli.cpp, so a main.cpp that only hands app() to option groups
// compiles without CLI11's header (forward.h).
class Program {
 public:
  explicit Program(const std::string& description);
  ~Program();
  CLI::App& app() { return *app_; }
  int run(int argc, char** argv, const std::function<int()>& body);

 private:
  std::unique_ptr<CLI::App> app_;
};

// CPU threads (GEMM and element-wise kernels): OMP_NUM_THREADS or OPENBLAS_NUM_THREADS when set,
// otherwise the ranks sharing a machine split the cores of their masks, and a rank alone uses every core,
// unbound from the one core mpirun gives it (common/core/cpu_cores.h).
void configure_cpu_threads(int ranks_on_this_machine);

}  // namespace course::cli
