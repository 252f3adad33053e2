// The folder of an output file, checked (output_folder.h).
#include "common/core/output_folder.h"

#include <unistd.h>

namespace course {

std::string output_folder_problem(const std::filesystem::path& folder) {
  namespace fs = std::filesystem;
  std::error_code error;
  if (fs::is_directory(folder, error))
    return ::access(folder.c_str(), W_OK | X_OK) == 0 ? "" : "its folder " + folder.string() + " is not writable";
  // The nearest part of the path that exists says what is wrong: a file where a folder was meant, or
  // nothing there at all.
  for (fs::path part = folder; !part.empty(); part = part.parent_path()) {
    if (fs::exists(fs::symlink_status(part, error)) && !fs::is_directory(part, error))
      return part == folder ? folder.string() + " is a file, not a folder"
                            : part.string() + ", on the way to " + folder.string() + ", is a file, not a folder";
    if (part == part.parent_path()) break;
  }
  return "its folder " + folder.string() + " does not exist";
}

}  // namespace course
