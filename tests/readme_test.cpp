// Every command a chapter's README shows in its code blocks, run as written, in the README's order: with
// the --allow-run-as-root the READMEs ask for as root (a command beyond 2 ranks must carry its own
// --oversubscribe, so that it runs as written on a 2-core machine), the build folder and scripts/ found
// from the source tree, and /tmp/ moved into a scratch folder (so that nothing lands in the source tree
// or collides with another test). Each must end with the exit
// code its README implies (1 where it shows a fault failing, 0 otherwise), and every output line the
// README shows under it must appear in its output, numbers masked (timings and rounding vary; the words,
// the order of fields and the verdicts may not). A block introduced by "Expected output" belongs to the
// commands of the block before it: each of its lines must appear in the output of one of them.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cctype>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <regex>
#include <sstream>
#include <thread>

#include "support/process.h"

namespace course::testing {
namespace {

namespace fs = std::filesystem;

struct Command {
  int line = 0;                       // in the README, for the failure message
  std::string text;                   // as written (continuations joined)
  std::vector<std::string> expected;  // the output lines shown under it
  int block = 0;                      // the code block it stands in
};

// An "Expected output" block: lines that the commands of code block `block` must print between them.
struct Expectation {
  int line = 0;
  int block = 0;
  std::vector<std::string> lines;
};

struct Readme {
  std::vector<Command> commands;
  std::vector<Expectation> expectations;
};

bool is_command(const std::string& line) {
  static const std::regex start(R"(^(mpirun |\$B |B=|rm -rf |python3 scripts/|build/release/))");
  return std::regex_search(line, start);
}

// The commands of a README's code blocks, each with the output lines shown after it: in its own block,
// or in a block that opens on the very next line (a command block, then its output block).
Readme commands_of(const std::string& readme) {
  Readme out;
  std::istringstream in(read_file(readme));
  bool in_block = false, expected_block = false;
  Command* current = nullptr;
  int number = 0, closed_at = -2, block = 0, last_command_block = 0;
  std::string paragraph;  // the last paragraph of text since the last code block
  bool blank = true;
  for (std::string line; std::getline(in, line);) {
    ++number;
    if (line.rfind("```", 0) == 0) {
      in_block = !in_block;
      expected_block = false;
      if (!in_block) paragraph.clear();
      if (in_block) {
        ++block;
        if (paragraph.find("Expected output") != std::string::npos && last_command_block > 0) {
          expected_block = true;
          out.expectations.push_back({number, last_command_block, {}});
        }
      }
      if (in_block && number == closed_at + 1 && !out.commands.empty()) current = &out.commands.back();  // its output
      else current = nullptr;
      if (!in_block) closed_at = number;
      continue;
    }
    if (!in_block) {
      if (line.empty()) {
        blank = true;
      } else {
        paragraph = blank ? line : paragraph + " " + line;
        blank = false;
      }
      continue;
    }
    if (expected_block) {
      if (!line.empty() && line != "..." && line.rfind("  ...", 0) != 0) out.expectations.back().lines.push_back(line);
      continue;
    }
    if (is_command(line)) {
      out.commands.push_back({number, line, {}, block});
      current = &out.commands.back();
      while (!current->text.empty() && current->text.back() == '\\' && std::getline(in, line)) {
        ++number;
        current->text.back() = ' ';
        const auto start = line.find_first_not_of(' ');
        if (start != std::string::npos) current->text.append(line, start, std::string::npos);
      }
      const auto comment = current->text.find("  #");
      if (comment != std::string::npos) current->text.erase(comment);
      if (current->text.find("--hostfile") == std::string::npos && current->text.rfind("B=", 0) != 0)
        last_command_block = block;
      continue;
    }
    if (current && !line.empty() && line != "..." && line.rfind("  ...", 0) != 0) current->expected.push_back(line);
  }
  return out;
}

// Every number as "#" and every run of spaces as one, so that timings, last digits and the columns they
// take may differ, and nothing else. A checksum (16 hexadecimal digits) is a number too: its bits are the
// GEMM kernels' that the library picks for the processor (oneDNN by instruction set), so the README's
// hold on the machine they were taken on; that two runs agree is each chapter's own --verify.
std::string masked(const std::string& text) {
  static const std::regex checksum(R"(\b[0-9a-f]{16}\b)"),
      number(R"([-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?)"), spaces(R"(\s+)");
  const std::string digits = std::regex_replace(std::regex_replace(text, checksum, "#"), number, "#");
  const std::string out = std::regex_replace(digits, spaces, " ");
  const auto first = out.find_first_not_of(' '), last = out.find_last_not_of(' ');
  return first == std::string::npos ? std::string() : out.substr(first, last - first + 1);
}

// The command as this machine runs it: the flags the READMEs ask for, the build and scripts found, /tmp
// in the scratch folder.
std::string adapted(std::string text, const fs::path& scratch) {
  const std::string build = fs::path(CHAPTER01_BINARY).parent_path().parent_path().string() + "/";
  const std::string root = fs::path(SOURCE_ROOT).string() + "/";
  auto replace_all = [&](const std::string& from, const std::string& to) {
    for (std::size_t at = text.find(from); at != std::string::npos; at = text.find(from, at + to.size()))
      text.replace(at, from.size(), to);
  };
  replace_all("/tmp/", (scratch / "tmp").string() + "/");
  replace_all("build/release/", build);
  replace_all("python3 scripts/", "python3 " + root + "scripts/");
  replace_all("python3 tests/", "python3 " + root + "tests/");
  static const std::regex np(R"(^mpirun -np (\d+))");
  std::smatch m;
  if (std::regex_search(text, m, np)) {
    std::string flags = ::getuid() == 0 ? " --allow-run-as-root" : "";
    if (std::stoi(m[1]) > static_cast<int>(std::thread::hardware_concurrency()) &&
        text.find("--oversubscribe") == std::string::npos)
      flags += " --oversubscribe";
    text.insert(static_cast<std::size_t>(m.length(0)), flags);
  }
  return text;
}

// The cores of the machine the course is written for (a 2-core laptop or CI runner).
constexpr int kCoursesCores = 2;

void run_readme(const std::string& chapter) {
  const std::string readme = std::string(SOURCE_ROOT) + "/" + chapter + "/README.md";
  const Readme parsed = commands_of(readme);
  const auto& commands = parsed.commands;
  ASSERT_FALSE(commands.empty()) << readme;
  const fs::path scratch = temp_path("readme_" + chapter);
  fs::create_directories(scratch / "tmp");
  const fs::path here = fs::current_path();
  fs::current_path(scratch);
  std::string environment;  // B=... assignments, in force for the commands after them
  std::map<int, std::vector<std::string>> printed;  // each block's commands' output lines, masked
  std::map<int, std::string> shown;                  // and as printed, for the failure message
  for (const Command& c : commands) {
    SCOPED_TRACE(readme + ":" + std::to_string(c.line) + ": " + c.text);
    const std::string text = adapted(c.text, scratch);
    if (c.text.rfind("B=", 0) == 0) {
      environment += text + "\n";
      continue;
    }
    if (c.text.find("--hostfile") != std::string::npos) continue;  // needs the machines it names
    // As written, on the course's 2-core machine: more ranks than that need --oversubscribe in the text.
    static const std::regex ranks(R"(^mpirun -np (\d+))");
    std::smatch n;
    if (std::regex_search(c.text, n, ranks) && std::stoi(n[1]) > kCoursesCores) {
      EXPECT_NE(c.text.find("--oversubscribe"), std::string::npos)
          << "the command runs " << n[1] << " ranks, more than a " << kCoursesCores
          << "-core machine has cores, and lacks --oversubscribe";
    }
    const fs::path script = scratch / "command.sh";
    { std::ofstream(script) << environment << text << "\n"; }
    const auto r = run_process("bash " + script.string());
    // A command the README shows failing (a fault injected, an error line, a FAILED verdict) must fail.
    bool shows_failure = c.text.find("--fault ") != std::string::npos;
    for (const auto& want : c.expected)
      shows_failure = shows_failure || want.rfind("error:", 0) == 0 || want.find("FAILED") != std::string::npos;
    if (shows_failure) EXPECT_NE(r.exit_code, 0) << r.out.substr(0, 4000) << r.err.substr(0, 2000);
    else EXPECT_EQ(r.exit_code, 0) << r.out.substr(0, 4000) << r.err.substr(0, 2000);
    std::vector<std::string> got;
    std::istringstream lines(r.out + r.err);
    for (std::string line; std::getline(lines, line);) got.push_back(masked(line));
    for (const auto& want : c.expected)
      EXPECT_NE(std::find(got.begin(), got.end(), masked(adapted(want, scratch))), got.end())
          << "the README shows\n  " << want << "\nwhich the output lacks:\n" << r.out.substr(0, 6000);
    printed[c.block].insert(printed[c.block].end(), got.begin(), got.end());
    shown[c.block] += r.out.substr(0, 3000);
  }
  for (const Expectation& e : parsed.expectations) {
    SCOPED_TRACE(readme + ":" + std::to_string(e.line) + ": the expected output");
    const auto& got = printed[e.block];
    for (const auto& want : e.lines)
      EXPECT_NE(std::find(got.begin(), got.end(), masked(adapted(want, scratch))), got.end())
          << "the README's expected output shows\n  " << want << "\nwhich the commands above it do not print:\n"
          << shown[e.block];
  }
  fs::current_path(here);
  fs::remove_all(scratch);
}

// A chapter README as a handout: the skeleton's sections in order and at most kHandoutWords words. Its
// line citations cannot drift from the code: every "`name` (line N)" or "`name` (lines N, M)" anywhere in
// it names a line of main.cpp that holds that name, "`name` (file.cpp, line N)" a line of that file of the
// chapter, "the fence (line N)" main.cpp's "// ----" line, and a bare "(line N)" a line that exists.
constexpr std::size_t kHandoutWords = 1500;
const std::vector<std::string> kHandouts = {"01_single_gpu", "02_grad_accumulation", "03_collectives", "04_ddp",
                                            "05_bucketing_overlap", "06_checkpoint_failover", "07_zero",
                                            "08_tensor_pipeline"};

TEST(Readme, HandoutsFollowTheSkeleton) {
  const std::vector<std::string> sections = {"## Goal", "## Run it", "## Expected output", "## Read the code",
                                             "## Key ideas", "## Exercises", "## Graded by"};
  for (const std::string& chapter : kHandouts) {
    SCOPED_TRACE(chapter);
    const std::string text = read_file(std::string(SOURCE_ROOT) + "/" + chapter + "/README.md");
    std::size_t at = 0;
    for (const auto& section : sections) {
      const auto found = text.find("\n" + section + "\n", at);
      ASSERT_NE(found, std::string::npos) << section << " missing, or out of order";
      at = found + 1;
    }
    std::istringstream words(text);
    EXPECT_LE(static_cast<std::size_t>(std::distance(std::istream_iterator<std::string>(words),
                                                     std::istream_iterator<std::string>())), kHandoutWords);
    std::map<std::string, std::vector<std::string>> files;  // the chapter's cited files, by line
    const auto lines_of = [&](const std::string& file) -> const std::vector<std::string>& {
      auto [at, fresh] = files.try_emplace(file);
      if (fresh) {
        std::istringstream source(read_file(std::string(SOURCE_ROOT) + "/" + chapter + "/" + file));
        for (std::string line; std::getline(source, line);) at->second.push_back(line);
      }
      return at->second;
    };
    static const std::regex cited(R"((?:`([^`]+)`\s+|(fence)\s+)?\((?:([\w./]+), )?lines? (\d+(?:, \d+)*)\))");
    int citations = 0;
    for (auto m = std::sregex_iterator(text.begin(), text.end(), cited); m != std::sregex_iterator(); ++m) {
      const std::string file = (*m)[3].matched ? (*m)[3].str() : "main.cpp";
      const auto& code = lines_of(file);
      ASSERT_FALSE(code.empty()) << (*m)[0] << ": " << file << " is empty or missing";
      std::istringstream numbers((*m)[4].str());
      for (std::string number; std::getline(numbers, number, ',');) {
        const auto line = static_cast<std::size_t>(std::stoul(number));
        ASSERT_GE(line, 1u) << (*m)[0];
        ASSERT_LE(line, code.size()) << (*m)[0] << ": " << file << " has " << code.size() << " lines";
        const std::string held = (*m)[1].matched ? (*m)[1].str() : (*m)[2].matched ? "// ----" : "";
        EXPECT_NE(code[line - 1].find(held), std::string::npos)
            << "the README cites " << (*m)[0] << ", and " << file << "'s line " << line << " is\n" << code[line - 1];
        citations += held.empty() ? 0 : 1;
      }
    }
    EXPECT_GE(citations, 3) << "the walk through main.cpp names no lines";
  }
}

// Mixed precision is taught once, in chapter 04: the chapters before it are plain float32 loops, with no
// precision in their code (the whole main.cpp), no precision flag, and none in their handouts' commands.
TEST(Readme, HandoutsBeforeChapter04HaveNoPrecision) {
  static const std::regex plumbing(R"(precision|[Aa]utocast|scale_loss|GradScaler|loss_scale|dtype\(\)|Recipe)");
  static const std::regex flags(R"(--precision|--loss-scale|--tf32)");
  for (const std::string chapter : {"01_single_gpu", "02_grad_accumulation", "03_collectives"}) {
    std::istringstream source(read_file(std::string(SOURCE_ROOT) + "/" + chapter + "/main.cpp"));
    int number = 0;
    bool fenced = false;
    for (std::string line; std::getline(source, line);) {
      ++number;
      fenced |= line.find("// ----") != std::string::npos;
      EXPECT_FALSE(std::regex_search(line, plumbing)) << chapter << "/main.cpp:" << number << " is precision plumbing:\n" << line;
    }
    EXPECT_TRUE(fenced) << chapter << "/main.cpp has no fence between its lesson and its diagnostics";
    const std::string readme = read_file(std::string(SOURCE_ROOT) + "/" + chapter + "/README.md");
    EXPECT_FALSE(std::regex_search(readme, flags)) << chapter << "/README.md names a precision flag";
  }
}

// The course's README: an index of at most kCourseReadmeWords words that links every chapter's handout,
// and gives the test command CI runs (.ci/run calls it, exactly).
constexpr std::size_t kCourseReadmeWords = 2500;

// Every Markdown page of the course: its relative links lead to files that exist and, with an anchor, to
// one of that page's headings (compared by their letters and digits: GitHub's slug of "Tensor parallelism:
// y = Σ xᵢ·Wᵢ" keeps the Σ and the ᵢ, which a renamed or moved section does not keep either); and a
// chapter's notes, NOTES.md and the pages beside it, at most kNotesWords words each (one topic a page).
constexpr std::size_t kNotesWords = 4000;

std::string letters_and_digits(const std::string& text) {
  std::string out;
  for (const unsigned char c : text)
    if (std::isalnum(c) && c < 128) out += static_cast<char>(std::tolower(c));
  return out;
}

TEST(Readme, HandoutsLinksLeadSomewhere) {
  namespace fs = std::filesystem;
  const fs::path root(SOURCE_ROOT);
  std::vector<fs::path> pages;
  for (auto it = fs::recursive_directory_iterator(root); it != fs::recursive_directory_iterator(); ++it) {
    const std::string name = it->path().filename().string();
    if (it->is_directory() && (name.rfind("build", 0) == 0 || name[0] == '.' || name == "runs")) {
      it.disable_recursion_pending();
      continue;
    }
    if (it->is_regular_file() && it->path().extension() == ".md") pages.push_back(it->path());
  }
  ASSERT_GE(pages.size(), 10u);
  static const std::regex link(R"(\]\(([^)\s]+)\))"), heading(R"((?:^|\n)#+ ([^\n]+))");
  int links = 0;
  for (const auto& page : pages) {
    const std::string text = read_file(page.string());
    if (page.filename().string().rfind("NOTES", 0) == 0) {
      std::istringstream words(text);
      EXPECT_LE(static_cast<std::size_t>(std::distance(std::istream_iterator<std::string>(words),
                                                       std::istream_iterator<std::string>())), kNotesWords)
          << page << ": split it by topic";
    }
    for (auto m = std::sregex_iterator(text.begin(), text.end(), link); m != std::sregex_iterator(); ++m) {
      const std::string target = (*m)[1].str();
      if (target.find("://") != std::string::npos || target.rfind("mailto:", 0) == 0) continue;
      const auto hash = target.find('#');
      const fs::path file = hash == 0 ? page : page.parent_path() / target.substr(0, hash);
      ++links;
      if (!fs::exists(file)) {
        ADD_FAILURE() << page << " links " << target << ": " << file << " does not exist";
        continue;
      }
      if (hash == std::string::npos) continue;
      const std::string anchor = letters_and_digits(target.substr(hash + 1)), linked = read_file(file.string());
      bool found = false;
      for (auto h = std::sregex_iterator(linked.begin(), linked.end(), heading); h != std::sregex_iterator() && !found; ++h)
        found = letters_and_digits((*h)[1].str()) == anchor;
      EXPECT_TRUE(found) << page << " links " << target << ": no heading of " << file << " has that anchor";
    }
  }
  EXPECT_GE(links, 50) << "no links found: the pattern is wrong";
}

TEST(Readme, HandoutsTheCourseReadmeIsAnIndex) {
  const std::string text = read_file(std::string(SOURCE_ROOT) + "/README.md");
  std::istringstream words(text);
  EXPECT_LE(static_cast<std::size_t>(std::distance(std::istream_iterator<std::string>(words),
                                                   std::istream_iterator<std::string>())), kCourseReadmeWords);
  for (const std::string& chapter : kHandouts)
    EXPECT_NE(text.find("](" + chapter + "/README.md)"), std::string::npos) << chapter << " is not linked";
  const std::string ci = read_file(std::string(SOURCE_ROOT) + "/.ci/run");
  EXPECT_NE(text.find("\n./scripts/run_tests.sh "), std::string::npos) << "the README gives no test command";
  EXPECT_NE(ci.find("\n./scripts/run_tests.sh\n"), std::string::npos) << ".ci/run does not call the README's test command";
}

TEST(Readme, Chapter01) { run_readme("01_single_gpu"); }
TEST(Readme, Chapter02) { run_readme("02_grad_accumulation"); }
TEST(Readme, Chapter03) { run_readme("03_collectives"); }
TEST(Readme, Chapter04) { run_readme("04_ddp"); }
TEST(Readme, Chapter05) { run_readme("05_bucketing_overlap"); }
TEST(Readme, Chapter06) { run_readme("06_checkpoint_failover"); }
TEST(Readme, Chapter07) { run_readme("07_zero"); }
TEST(Readme, Chapter08) { run_readme("08_tensor_pipeline"); }

}  // namespace
}  // namespace course::testing
