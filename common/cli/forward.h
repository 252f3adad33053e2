// CLI11's classes named without its header: a header that only passes a CLI::App& along (an option
// group's add_* function, a chapter's Options) leaves CLI11 to the files that add or read flags. Its
// header alone takes about 8 s to compile, and 31 files of the course parsed it through such headers.
#pragma once

namespace CLI {
class App;
class Option;
class Validator;
}  // namespace CLI
