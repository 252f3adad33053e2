// Exercise 06.1, chapter 06's atomic write (06_checkpoint_failover/atomic_write.cpp), on a disk that keeps
// what a crash would keep apart from what the running program sees (the model of Pillai et al., OSDI 2014:
// a file's bytes are durable once it is fsynced, a folder's entries once the folder is), crashed after
// every call; and on the real disk.
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <stdexcept>

#include "06_checkpoint_failover/atomic_write.h"

namespace course::testing {
namespace {
namespace fs = std::filesystem;

// Files are inodes with the bytes the program sees and the bytes on the disk; a folder maps names to
// inodes, as the program sees it and as the disk holds it. crash_view() is what a reboot would find.
class CrashingDisk final : public chapter06::Disk {
 public:
  struct Inode {
    std::string seen, durable;
  };
  std::map<std::string, std::shared_ptr<Inode>> seen, durable;  // name -> file, in the one folder "dir"
  std::vector<std::string> calls;
  std::function<void()> after_call;  // the test's look at the disk after each call (a crash there)
  int fail_write_at = -1;            // the write that fails (disk full), or none
  std::map<int, std::shared_ptr<Inode>> open;
  std::map<int, std::string> open_name;
  int next_fd = 3, writes = 0;

  explicit CrashingDisk(const std::string& old) {
    seen["dir/ckpt"] = durable["dir/ckpt"] = std::make_shared<Inode>(Inode{old, old});
  }
  std::map<std::string, std::string> crash_view() const {
    std::map<std::string, std::string> view;
    for (const auto& [name, inode] : durable) view[name] = inode->durable;
    return view;
  }
  void did(const std::string& call) {
    calls.push_back(call);
    if (after_call) after_call();
  }
  int create_new(const std::string& path) override {
    if (seen.count(path)) throw std::runtime_error(path + " exists");
    auto inode = std::make_shared<Inode>();
    seen[path] = inode;
    open[next_fd] = inode;
    open_name[next_fd] = path;
    did("create_new " + path);
    return next_fd++;
  }
  void write(int file, std::string_view bytes) override {
    if (writes++ == fail_write_at) throw std::runtime_error("No space left on device");
    open.at(file)->seen += bytes;
    did("write " + open_name.at(file));
  }
  void fsync(int file) override {
    open.at(file)->durable = open.at(file)->seen;
    did("fsync " + open_name.at(file));
  }
  void close(int file) override {
    open_name.at(file);
    did("close " + open_name.at(file));
  }
  void rename(const std::string& from, const std::string& to) override {
    if (!seen.count(from)) throw std::runtime_error("rename: " + from + " does not exist");
    if (fs::path(from).parent_path() != fs::path(to).parent_path())
      throw std::runtime_error("rename from " + from + " to " + to + ": another folder (another file system?)");
    seen[to] = seen[from];
    seen.erase(from);
    did("rename " + from + " " + to);
  }
  void fsync_folder(const std::string& folder) override {
    if (folder == "dir") durable = seen;
    did("fsync_folder " + folder);
  }
  void remove(const std::string& path) override {
    seen.erase(path);
    did("remove " + path);
  }
};

const std::string kOld = "the old checkpoint", kNew = "the new checkpoint, longer";
const std::vector<std::string_view> kPieces{"the new ", "checkpoint", ", longer"};

TEST(Exercise06, TheNewFileReplacesTheOldWithNothingLeftBeside) {
  CrashingDisk disk(kOld);
  chapter06::write_atomically(disk, "dir/ckpt", kPieces);
  ASSERT_EQ(disk.seen.size(), 1u) << "a temporary was left beside the checkpoint";
  ASSERT_TRUE(disk.seen.count("dir/ckpt"));
  EXPECT_EQ(disk.seen["dir/ckpt"]->seen, kNew);
  ASSERT_FALSE(disk.calls.empty());
  EXPECT_EQ(disk.calls.front(), "create_new " + chapter06::temporary_beside("dir/ckpt"))
      << "the pieces go into a new temporary beside the file (temporary_beside), never into the file itself";
}

// Crashed after every call: a reboot finds the old checkpoint or the new one, whole, never a mixture.
TEST(Exercise06, ACrashAtAnyMomentLeavesTheOldFileOrTheNewOne) {
  CrashingDisk disk(kOld);
  disk.after_call = [&] {
    const auto view = disk.crash_view();
    const auto it = view.find("dir/ckpt");
    ASSERT_NE(it, view.end()) << "a crash after '" << disk.calls.back() << "' leaves no checkpoint at all";
    EXPECT_TRUE(it->second == kOld || it->second == kNew)
        << "a crash after '" << disk.calls.back() << "' leaves dir/ckpt holding '" << it->second
        << "': neither the old file nor the new one (were the bytes synced before the rename named them?)";
  };
  chapter06::write_atomically(disk, "dir/ckpt", kPieces);
}

// Once the write has returned, the run goes on and deletes older checkpoints: the new one must survive.
TEST(Exercise06, OnceItReturnsTheNewFileSurvivesACrash) {
  CrashingDisk disk(kOld);
  chapter06::write_atomically(disk, "dir/ckpt", kPieces);
  EXPECT_EQ(disk.crash_view()["dir/ckpt"], kNew)
      << "write_atomically returned, yet a crash now brings back the old file: the rename is durable only once the "
         "folder is synced";
}

// The disk fills up halfway: the error reaches the caller, the old file stays, no temporary is left.
TEST(Exercise06, AFailedWriteLeavesTheOldFileAndNoTemporary) {
  CrashingDisk disk(kOld);
  disk.fail_write_at = 1;
  EXPECT_THROW(chapter06::write_atomically(disk, "dir/ckpt", kPieces), std::runtime_error);
  EXPECT_EQ(disk.seen.size(), 1u) << "the temporary of a failed write was left behind";
  EXPECT_EQ(disk.seen["dir/ckpt"]->seen, kOld);
}

// On the real disk, through the chapter's FileWriter: the bytes arrive, an existing file is replaced,
// nothing is left beside it, and a link in the file's place is refused, its target untouched.
TEST(Exercise06, TheRealDiskGetsTheFileAndALinkIsRefused) {
  const fs::path dir = fs::temp_directory_path() / ("course_atomic_write_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string path = (dir / "ckpt").string();
  std::ofstream(path) << kOld;
  std::size_t reported = 0;
  chapter06::write_file(path, kPieces, [&](std::size_t written, std::size_t) { reported = written; });
  std::ifstream in(path);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), {}), kNew);
  EXPECT_EQ(reported, kNew.size());
  EXPECT_EQ(std::distance(fs::directory_iterator(dir), fs::directory_iterator()), 1) << "a temporary was left";
  const fs::path victim = dir / "victim", link = dir / "linked";
  std::ofstream(victim) << "keep me";
  fs::create_symlink(victim, link);
  EXPECT_THROW(chapter06::write_file(link.string(), kPieces, {}), checkpoint::CheckpointError);
  std::ifstream kept(victim);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(kept), {}), "keep me");
  fs::remove_all(dir);
}

}  // namespace
}  // namespace course::testing
