// What is wrong with the folder a file is to be written into, in the words a user needs: it does not
// exist, it is a file, or it is not writable. One home for every flag that names an output file.
#pragma once
#include <filesystem>
#include <string>

namespace course {

// "" when `folder` is a folder this process may create files in; else "its folder F does not exist",
// "F is a file, not a folder" (on the way to it: "A, on the way to F, is a file") or "its folder F is not
// writable".
std::string output_folder_problem(const std::filesystem::path& folder);

}  // namespace course
