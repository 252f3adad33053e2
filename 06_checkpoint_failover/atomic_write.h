// Chapter 06's atomic write, the exercise of the chapter (06.1): how a checkpoint reaches the disk so that
// a crash at any moment leaves the old file or the new one, never a mixture. Every checkpoint and `latest`
// pointer the chapter writes goes through it (Checkpoints hands write_file to its folder); the library
// keeps its own (checkpoint::write_file_atomically, for every other chapter), and the graded tests hold this
// one against a disk that can crash between any two calls (tests/atomic_write_exercise_test.cpp).
#pragma once
#include <string>
#include <string_view>
#include <vector>

#include "common/checkpoint/safetensors.h"  // WriteProgress, CheckpointError

namespace course::chapter06 {

// The file-system calls an atomic write is made of. On the real disk each throws CheckpointError when it
// fails; the tests' disk records them and can crash after any one.
class Disk {
 public:
  virtual ~Disk() = default;
  virtual int create_new(const std::string& path) = 0;       // open(O_WRONLY | O_CREAT | O_EXCL): only a new file
  virtual void write(int file, std::string_view bytes) = 0;  // all of `bytes`, after what is there
  virtual void fsync(int file) = 0;                          // the file's bytes durable on the disk
  virtual void close(int file) = 0;
  virtual void rename(const std::string& from, const std::string& to) = 0;  // atomic; replaces `to`
  virtual void fsync_folder(const std::string& folder) = 0;  // the folder's entries (a rename) durable
  virtual void remove(const std::string& path) = 0;
};

// ".NAME.tmp.PID" beside `path`, the temporary's name (checkpoint::is_partial_write knows it), and the
// folder `path` is in ("." for a bare name).
std::string temporary_beside(const std::string& path);
std::string folder_of(const std::string& path);

// Replaces `path` with `pieces`, one after the other, so that a crash at any moment leaves either the
// old file or the new one whole, and once it returns the new one survives a crash.
void write_atomically(Disk& disk, const std::string& path, const std::vector<std::string_view>& pieces);

// The chapter's checkpoint::FileWriter: refuses to replace anything but a regular file (a link, a folder,
// a pipe), then write_atomically on the real disk, reporting `progress` as the bytes go out.
void write_file(const std::string& path, const std::vector<std::string_view>& pieces,
                const checkpoint::WriteProgress& progress);

}  // namespace course::chapter06
