// The communicator: rank, size, local rank, and collectives on CPU or CUDA tensors (either backend
// takes either: MPI stages CUDA tensors through pinned host memory, NCCL stages CPU tensors through
// device memory) of any element type (float32, bfloat16, float16: a 16-bit reduction computes in
// float32 and rounds each partial result to 16 bits, as NCCL's does, and a 16-bit average multiplies
// each rank's values by 1/N before adding them, as NCCL's ncclAvg does for floating types, so that it
// cannot overflow where the values do not), each with an asynchronous form. Chapters program against this class and never see
// which backend (MPI or NCCL) runs underneath. Every collective is numbered and watched (watchdog.h).
#pragma once
#include <chrono>
#include <memory>
#include <string>

#include "common/tensor/tensor.h"

namespace course::comm {

// The longest a collective may be given before the watchdog acts: a week. It bounds --timeout so
// that the deadline (now + timeout) can never overflow the clock.
constexpr double kMaxTimeoutSeconds = 7 * 24 * 3600.0;

enum class ReduceOp { sum, average, max };
const char* reduce_op_name(ReduceOp op);

// A collective in flight. wait() blocks until it is complete (and rethrows its error); test() polls.
class Work {
 public:
  virtual ~Work() = default;
  virtual void wait() = 0;
  virtual bool test() = 0;
};
using WorkHandle = std::shared_ptr<Work>;
WorkHandle completed_work();  // a work that is already done: for hooks that finish synchronously

// What a float32 buffer holds: float32 values, or 16-bit values packed two to each float32 slot (the
// compression hooks of chapter 05, written before tensors had 16-bit types; packed buffers support
// ReduceOp::sum only). A bfloat16 or float16 tensor is reduced as its type without this.
enum class Element { float32, float16, bfloat16 };

// What to run: one description per call, so each backend implements one dispatch.
enum class OpKind { broadcast, reduce, all_reduce, all_gather, reduce_scatter, scatter, gather, barrier, send, recv,
                    send_recv, all_to_all };
const char* op_name(OpKind kind);
struct Collective {
  OpKind kind;
  Tensor input;    // read (for in-place ops, input and output are the same tensor)
  Tensor output;   // written
  int root = 0;    // root for rooted ops; destination peer for send and send_recv
  int peer = 0;    // source peer for recv and send_recv
  int tag = 0;
  ReduceOp op = ReduceOp::sum;
  Element element = Element::float32;
  bool ring_order = false;  // the group's add_in_ring_order(), set by the communicator
};

// Where a process sits in a group: its rank and the group's size, the same counted among the group's
// processes on its machine, and which machine (the world rank of that machine's first process).
struct Placement {
  int rank = 0, size = 1;
  int local_rank = 0, local_size = 1;
  int node = 0;
  int machines = 1;  // how many machines the world spans
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  int rank() const { return placement_.rank; }
  int size() const { return placement_.size; }
  int local_rank() const { return placement_.local_rank; }  // rank among this group's processes on this machine
  int local_size() const { return placement_.local_size; }
  const Placement& placement() const { return placement_; }
  virtual std::string backend_name() const = 0;

  // Asynchronous forms. The tensors must stay alive and untouched until the work completes.
  WorkHandle broadcast_async(Tensor& tensor, int root);
  WorkHandle reduce_async(Tensor& tensor, int root, ReduceOp op = ReduceOp::sum);  // result on root
  WorkHandle all_reduce_async(Tensor& tensor, ReduceOp op = ReduceOp::sum);
  WorkHandle all_reduce_async(Tensor& packed, ReduceOp op, Element element);  // 16-bit: sum only
  WorkHandle all_gather_async(const Tensor& input, Tensor& output);         // output: size() x input
  WorkHandle reduce_scatter_async(const Tensor& input, Tensor& output, ReduceOp op = ReduceOp::sum);  // input: size() x output
  WorkHandle scatter_async(const Tensor& input, Tensor& output, int root);  // root's input: size() x output
  WorkHandle gather_async(const Tensor& input, Tensor& output, int root);   // root's output: size() x input
  // MPI_Alltoall: input and output are size() equal slices; slice j of this rank's input becomes slice
  // `rank()` of rank j's output (what moves a sequence-sharded tensor to a head-sharded one, Ulysses).
  WorkHandle all_to_all_async(const Tensor& input, Tensor& output);
  WorkHandle barrier_async();

  // Blocking forms: the asynchronous form, then wait().
  void broadcast(Tensor& tensor, int root) { broadcast_async(tensor, root)->wait(); }
  void reduce(Tensor& tensor, int root, ReduceOp op = ReduceOp::sum) { reduce_async(tensor, root, op)->wait(); }
  void all_reduce(Tensor& tensor, ReduceOp op = ReduceOp::sum) { all_reduce_async(tensor, op)->wait(); }
  void all_gather(const Tensor& input, Tensor& output) { all_gather_async(input, output)->wait(); }
  void reduce_scatter(const Tensor& input, Tensor& output, ReduceOp op = ReduceOp::sum) {
    reduce_scatter_async(input, output, op)->wait();
  }
  void scatter(const Tensor& input, Tensor& output, int root) { scatter_async(input, output, root)->wait(); }
  void gather(const Tensor& input, Tensor& output, int root) { gather_async(input, output, root)->wait(); }
  void all_to_all(const Tensor& input, Tensor& output) { all_to_all_async(input, output)->wait(); }
  void barrier() { barrier_async()->wait(); }

  // Point to point. The asynchronous forms let a pipeline stage compute while activations travel;
  // on NCCL one communicator's point-to-point calls run in the order they were issued, so post them
  // in matching order on both sides (or use send_recv). send_recv sends to `dst` while receiving
  // from `src`, so a ring cannot deadlock.
  WorkHandle send_async(const Tensor& tensor, int dst, int tag = 0);
  WorkHandle recv_async(Tensor& tensor, int src, int tag = 0);
  void send(const Tensor& tensor, int dst, int tag = 0) { send_async(tensor, dst, tag)->wait(); }
  void recv(Tensor& tensor, int src, int tag = 0) { recv_async(tensor, src, tag)->wait(); }
  void send_recv(const Tensor& send, int dst, Tensor& recv, int src, int tag = 0);

  // Ranks with the same colour form a new communicator, ordered by key (then by rank). Collective
  // over this communicator. The new group's local rank and size count its own members on each machine.
  std::unique_ptr<Communicator> split(int color, int key);

  // From now on this group adds float32 values (sums and averages) in the ring's fixed order too
  // (comm::algorithms::reduce_scatter_step), as it always adds 16-bit ones, so that a reference of its
  // ranks in one process (verify::LocalGroup) repeats the sums bit for bit at any size: chapter 08's
  // tensor-parallel groups under --verify (its GridCheck turns it on), whose float32 sums (the
  // vocabulary-parallel loss's softmax, the gradients of the layers every rank holds) feed the roundings
  // of a 16-bit run. Otherwise a float32 sum goes the library's way (MPI chooses its algorithm by the
  // message's size and the group's). Call it on every rank of the group before its first collective;
  // groups split() from it inherit it. NCCL adds on its own ring whatever this says.
  virtual void add_in_ring_order() { ring_order_ = true; }
  bool adds_in_ring_order() const { return ring_order_; }

  // Bytes of payload this rank has handed to collectives and sends so far (what crosses its link).
  std::int64_t bytes_sent() const { return bytes_sent_; }

  // How long a collective may take before the watchdog aborts the job (at most kMaxTimeoutSeconds).
  // Groups made by split() inherit it.
  void set_timeout(std::chrono::milliseconds timeout);
  std::chrono::milliseconds timeout() const { return timeout_; }

  // COURSE_CHECK_COLLECTIVES=1 (consistency.cpp): the ranks compare each collective before running it.
  // Throws UsageError when the variable is neither 0 nor 1 (read once).
  static bool consistency_checks();

 protected:
  explicit Communicator(const Placement& placement) : placement_(placement) {}
  // The backend's entry points: start `c` and return its work; make the sub-group of a split
  // (its rank and size set, its local fields still the parent's).
  virtual WorkHandle start(const Collective& c) = 0;
  virtual std::unique_ptr<Communicator> split_group(int color, int key) = 0;
  std::chrono::milliseconds timeout_{std::chrono::seconds(300)};

 private:
  WorkHandle submit(Collective c);  // checks arguments, numbers the op, attaches the watchdog
  void check_consistency(const Collective& c);
  void check_root(int root, const char* what) const;
  void check_peer(int peer, const char* what) const;
  Placement placement_;
  long sequence_ = 0;
  long collectives_ = 0;  // the collectives alone (not point to point), to name one in the check's message
  std::int64_t bytes_sent_ = 0;
  bool ring_order_ = false;
};

}  // namespace course::comm
