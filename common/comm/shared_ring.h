// The MPI backend's ring of ordered sums through memory that the ranks of one machine share: each
// rank's chunks travel to the next rank in segments through a few slots of that memory, and are added
// there as they arrive, with no message, no copy into a receive buffer and no second pass.
#pragma once
#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "common/comm/algorithms.h"

namespace course::comm {

// Why: a message between two ranks on one machine is copied by MPI into the receiver's buffer (one
// read and one write of every byte, through memory once the chunk outgrows the cache), then read
// again to be added. Here a segment is written into a slot that stays in cache, and the next rank
// adds it to its own values straight from there: every byte of the sums crosses main memory about
// half as often. The order of the sums is the ring's (algorithms::reduce_scatter_step), so the bits
// are those of the message-passing ring and of verify::LocalGroup.
//
// Flow control is two counters per rank, both only ever increasing, from one call to the next:
// `posted` (the segments this rank has written for the next) and `taken` (the segments it has taken
// from the previous rank's slots). A rank writes segment k into slot k % kSlots once the next rank
// has taken segment k - kSlots, and reads segment k once the previous rank has posted it. Taking
// never waits for a free slot, so the ring cannot lock: every segment taken is one its writer may
// reuse.
class SharedRing {
 public:
  static constexpr std::size_t kSegmentBytes = 64 * 1024;  // a segment stays in L2 while it is added
  static constexpr std::uint64_t kSlots = 8;               // segments in flight per rank

  // The ring over `comm`, or null where its ranks are not all on one machine or cannot map shared
  // memory (then MPI's messages carry the ring). Collective over `comm`; closing it is not (the memory
  // is unmapped, and its name was removed once every rank had mapped it), so a rank that stops early
  // cannot leave the others waiting in a destructor.
  static std::unique_ptr<SharedRing> open(MPI_Comm comm);
  ~SharedRing();
  SharedRing(const SharedRing&) = delete;
  SharedRing& operator=(const SharedRing&) = delete;

  // The ring's sum of `values` over the ranks, `add(arriving, own)` making each partial: in place on
  // every rank (`block` null), or only this rank's chunk (algorithms::chunk_of) into `block`.
  template <typename Value, typename Add>
  void sum(Value* values, std::size_t count, Value* block, Add add);

 private:
  struct alignas(64) Counter {
    std::atomic<std::uint64_t> value{0};
  };
  struct Header {  // at the start of each rank's part of the window
    Counter posted, taken;
    Counter stopped;  // 1 once this rank has stopped a sum with an error: its neighbours stop too
  };
  // Before each slot's values: the sum they belong to, which the taker checks against its own, so that
  // ranks adding different counts or types stop with a message instead of adding stale values.
  struct alignas(64) Label {
    std::uint64_t count, width;
  };
  static constexpr std::size_t kSlotBytes = sizeof(Label) + kSegmentBytes;
  SharedRing() = default;
  static constexpr std::size_t kPartBytes = sizeof(Header) + kSlots * kSlotBytes;  // one rank's
  unsigned char* part(int rank) const { return static_cast<unsigned char*>(memory_) + static_cast<std::size_t>(rank) * kPartBytes; }
  Header& header(int rank) const { return *reinterpret_cast<Header*>(part(rank)); }
  unsigned char* slot(int rank, std::uint64_t segment) const {
    return part(rank) + sizeof(Header) + static_cast<std::size_t>(segment % kSlots) * kSlotBytes;
  }
  // The segment's slot (its label) once it may be written (the next rank has taken the one before it
  // in its slot) or read (the previous rank has posted it).
  unsigned char* writable(std::uint64_t segment);
  unsigned char* readable(std::uint64_t segment);
  void post(std::uint64_t segments) { header(rank_).posted.value.store(segments, std::memory_order_release); }
  void take(std::uint64_t segments) { header(rank_).taken.value.store(segments, std::memory_order_release); }
  // Gives the core away (with more ranks than cores, the peer needs it), or throws if a neighbour has
  // stopped: the error goes round the ring, and no rank waits for one that will never write or read.
  void wait_a_moment();
  // Throws, naming both, unless the previous rank's segment is of this sum (`count` values of `width`
  // bytes). A group whose sum stopped stays stopped: its slots and counters no longer agree.
  void check_label(const unsigned char* slot, std::size_t count, std::size_t width);
  [[noreturn]] void stop(const std::string& why);

  void* memory_ = nullptr;
  std::size_t bytes_ = 0;
  int rank_ = 0, size_ = 1;
  std::uint64_t known_taken_ = 0, known_posted_ = 0;  // the last values read of next's and previous's counters
};

// The schedule, for one rank: its stream of segments to the next rank is the chunks it sends, in
// order, each cut into segments from its start; the previous rank's stream, which it takes, is the
// chunks it receives, cut alike. In the reduce-scatter it sends its own values of one chunk first;
// every later segment it sends is one it has just made: the partial sum it took and added (the next
// step's send is this step's receive), then its complete chunk, then the complete chunks it takes on
// in the all-gather. So segment i of what it takes becomes segment `first + i` of what it sends, and
// is copied into its slot while it is still in cache.
template <typename Value, typename Add>
void SharedRing::sum(Value* values, std::size_t count, Value* block, Add add) {
  const int n = size_, r = rank_;
  constexpr std::size_t per = kSegmentBytes / sizeof(Value);
  const auto segments = [&](algorithms::Chunk c) { return (c.size() + per - 1) / per; };
  // The chunks this rank takes, in order, and whether each ends an all-reduce (taken into values only).
  struct Step {
    algorithms::Chunk chunk;
    bool reduce;
  };
  std::vector<Step> steps;
  for (int s = 0; s + 1 < n; ++s)
    steps.push_back({algorithms::chunk_of(count, n, algorithms::reduce_scatter_step(r, s, n).receive), true});
  if (!block)
    for (int s = 0; s + 1 < n; ++s)
      steps.push_back({algorithms::chunk_of(count, n, algorithms::all_gather_step(r, s, n).receive), false});
  const algorithms::Chunk first_chunk = algorithms::chunk_of(count, n, algorithms::reduce_scatter_step(r, 0, n).send);
  const std::uint64_t first = n > 1 ? segments(first_chunk) : 0;
  std::uint64_t taking = 0;  // this call's segments to take
  for (const Step& s : steps) taking += segments(s.chunk);
  // Every segment taken is sent on, except the last step's: the last all-gather step's, or, for a
  // reduce-scatter into `block`, the complete chunk.
  const std::uint64_t last = steps.empty() ? 0 : segments(steps.back().chunk);
  const std::uint64_t sending = first + taking - last;
  if (header(r).stopped.value.load(std::memory_order_relaxed)) stop("an earlier ordered sum of this group stopped");
  const std::uint64_t taken0 = header(r).taken.value.load(std::memory_order_relaxed);
  const std::uint64_t posted0 = header(r).posted.value.load(std::memory_order_relaxed);
  std::size_t step = 0, within = 0;  // the step of the next segment to take, and its segment in it
  std::uint64_t taken = 0, sent = 0;
  // The values behind segment `o` of what this rank sends: its first chunk, or a segment it took.
  std::vector<std::pair<std::size_t, std::size_t>> made;  // (offset, size) of segments taken, in order
  made.reserve(static_cast<std::size_t>(taking));
  const auto send_ready = [&]() -> bool {
    if (sent == sending) return false;
    if (sent >= first && taken <= sent - first) return false;  // not made yet
    return true;
  };
  while (taken < taking || sent < sending) {
    bool moved = false;
    if (taken < taking) {
      if (unsigned char* from = readable(taken0 + taken)) {
        while (segments(steps[step].chunk) == 0) ++step;  // a chunk of no values (fewer values than ranks)
        const Step& s = steps[step];
        const std::size_t at = s.chunk.begin + within * per, size = std::min(per, s.chunk.end - at);
        check_label(from, count, sizeof(Value));
        const auto* arriving = reinterpret_cast<const Value*>(from + sizeof(Label));
        Value* own = values + at;
        if (s.reduce)
          for (std::size_t i = 0; i < size; ++i) own[i] = add(arriving[i], own[i]);
        else
          std::copy(arriving, arriving + size, own);
        made.emplace_back(at, size);
        take(taken0 + ++taken);
        if (++within == segments(s.chunk)) ++step, within = 0;
        moved = true;
      }
    }
    while (send_ready()) {
      unsigned char* to = writable(posted0 + sent);
      if (!to) break;
      std::size_t at, size;
      if (sent < first) {
        at = first_chunk.begin + static_cast<std::size_t>(sent) * per;
        size = std::min(per, first_chunk.end - at);
      } else {
        std::tie(at, size) = made[static_cast<std::size_t>(sent - first)];
      }
      *reinterpret_cast<Label*>(to) = Label{count, sizeof(Value)};
      std::copy(values + at, values + at + size, reinterpret_cast<Value*>(to + sizeof(Label)));
      post(posted0 + ++sent);
      moved = true;
    }
    if (!moved) wait_a_moment();
  }
  if (block) {
    const algorithms::Chunk mine = algorithms::chunk_of(count, n, r);
    std::copy(values + mine.begin, values + mine.end, block);
  }
}

}  // namespace course::comm
