// Opening the shared ring (POSIX shared memory, mapped by every rank of one machine) and its waits.
#include "common/comm/shared_ring.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <new>
#include <random>
#include <stdexcept>
#include <string>

namespace course::comm {

std::unique_ptr<SharedRing> SharedRing::open(MPI_Comm comm) {
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  // All on one machine: the machine's part of the group is the whole group, on every rank.
  // COURSE_SHM_DISABLE=1 (as NCCL_SHM_DISABLE) sends them as MPI's messages even so: to compare, and to test.
  // Any other value is refused on every rank alike (they share the environment), before any collective.
  const std::string disabled = std::getenv("COURSE_SHM_DISABLE") ? std::getenv("COURSE_SHM_DISABLE") : "";
  if (!disabled.empty() && disabled != "0" && disabled != "1")
    throw std::invalid_argument("COURSE_SHM_DISABLE: '" + disabled + "' is not 0 or 1");
  MPI_Comm node = MPI_COMM_NULL;
  int together = 0;
  const bool allowed = disabled != "1";
  if (allowed && MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node) == MPI_SUCCESS) {
    int node_size = 0;
    MPI_Comm_size(node, &node_size);
    together = node_size == size;
    MPI_Comm_free(&node);
  }
  MPI_Allreduce(MPI_IN_PLACE, &together, 1, MPI_INT, MPI_LAND, comm);
  if (!together) return nullptr;

  // Rank 0 makes the memory under a name nobody else holds (O_EXCL), the others open it by that name,
  // and once every rank has mapped it the name is removed: an open ring leaves nothing behind, however
  // the run ends. The memory is taken whole at once (posix_fallocate): a full /dev/shm is a refusal
  // here, and then the messages, never a SIGBUS at the first write.
  const std::size_t bytes = kPartBytes * static_cast<std::size_t>(size);
  char name[64] = {};
  int fd = -1;
  if (rank == 0) {
    std::random_device entropy;
    for (int attempt = 0; attempt < 8 && fd < 0; ++attempt) {
      std::snprintf(name, sizeof name, "/course-ring-%ld-%08x", static_cast<long>(getpid()), entropy());
      fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
    }
    if (fd >= 0 && posix_fallocate(fd, 0, static_cast<off_t>(bytes)) != 0) {
      close(fd);
      shm_unlink(name);
      fd = -1;
    }
    if (fd < 0) name[0] = '\0';
  }
  MPI_Bcast(name, sizeof name, MPI_CHAR, 0, comm);
  if (name[0] == '\0') return nullptr;  // no shared memory here: every rank learns it from rank 0
  if (rank != 0) fd = shm_open(name, O_RDWR, 0);
  void* memory = fd >= 0 ? mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
  if (fd >= 0) close(fd);
  int mapped = memory != MAP_FAILED;
  MPI_Allreduce(MPI_IN_PLACE, &mapped, 1, MPI_INT, MPI_LAND, comm);
  if (rank == 0) shm_unlink(name);
  if (!mapped) {
    if (memory != MAP_FAILED) munmap(memory, bytes);
    return nullptr;
  }
  std::unique_ptr<SharedRing> ring(new SharedRing);
  ring->memory_ = memory;
  ring->bytes_ = bytes;
  ring->rank_ = rank;
  ring->size_ = size;
  new (ring->part(rank)) Header();  // the counters at zero (the memory is zero already; this says so)
  MPI_Barrier(comm);
  return ring;
}

SharedRing::~SharedRing() {
  if (memory_) munmap(memory_, bytes_);
}

unsigned char* SharedRing::writable(std::uint64_t segment) {
  // Segment k reuses segment k - kSlots's slot: the next rank must have taken that one.
  if (known_taken_ + kSlots <= segment) {
    known_taken_ = header((rank_ + 1) % size_).taken.value.load(std::memory_order_acquire);
    if (known_taken_ + kSlots <= segment) return nullptr;
  }
  return slot(rank_, segment);
}

unsigned char* SharedRing::readable(std::uint64_t segment) {
  const int previous = (rank_ + size_ - 1) % size_;
  if (known_posted_ <= segment) {
    known_posted_ = header(previous).posted.value.load(std::memory_order_acquire);
    if (known_posted_ <= segment) return nullptr;
  }
  return slot(previous, segment);
}

void SharedRing::check_label(const unsigned char* slot, std::size_t count, std::size_t width) {
  const Label& label = *reinterpret_cast<const Label*>(slot);
  if (label.count == count && label.width == width) return;
  stop("an ordered sum of " + std::to_string(count) + " values of " + std::to_string(width) + " bytes on rank " +
       std::to_string(rank_) + " met one of " + std::to_string(label.count) + " values of " +
       std::to_string(label.width) + " bytes from rank " + std::to_string((rank_ + size_ - 1) % size_) +
       ": every rank must add the same");
}

void SharedRing::stop(const std::string& why) {
  header(rank_).stopped.value.store(1, std::memory_order_release);
  throw std::runtime_error(why);
}

void SharedRing::wait_a_moment() {
  for (const int neighbour : {(rank_ + 1) % size_, (rank_ + size_ - 1) % size_})
    if (header(neighbour).stopped.value.load(std::memory_order_acquire))
      stop("rank " + std::to_string(neighbour) + " stopped this ordered sum (every rank must add the same count and type)");
  sched_yield();
}

}  // namespace course::comm
