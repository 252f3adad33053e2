// The MPI backend. Collectives run on a communication thread that owns their order, so the async
// forms really proceed in the background while the caller computes (Open MPI makes no progress on
// non-blocking collectives between calls). CUDA tensors are staged through pinned host buffers,
// because Debian's Open MPI is not CUDA-aware. Sums in the ring's order go through shared memory where
// the ranks share a machine (shared_ring.h).
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <limits>
#include <future>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <type_traits>
#include <vector>

#include "common/comm/algorithms.h"
#include "common/comm/backends.h"
#include "common/comm/shared_ring.h"
#include "common/core/cuda_runtime.h"
#include "common/core/dtype.h"
#include "common/kernels/half.h"
#include "common/kernels/kernels.h"

namespace course::comm {
namespace {

void check_mpi(int code, const char* call) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  throw std::runtime_error(std::string(call) + ": " + std::string(text, static_cast<std::size_t>(length)));
}

// The count of MPI elements: the tensor's, or twice it for a packed 16-bit buffer.
int count_of(const Tensor& t, int per_element = 1) {
  if (!t.defined()) return 0;
  if (t.numel() > std::numeric_limits<int>::max() / per_element)
    throw std::invalid_argument("tensor too large for one MPI call");
  return static_cast<int>(t.numel()) * per_element;
}

// A host pointer for a tensor of any element type: the tensor itself on the CPU, a pinned copy for a
// CUDA tensor.
class HostBuffer {
 public:
  HostBuffer(const Tensor& t, bool copy_in) : tensor_(t) {
    if (!t.defined() || t.device() == Device::cpu) {
      host_ = t.defined() ? t.raw() : nullptr;
      return;
    }
#if COURSE_HAVE_CUDA
    pinned_ = allocate_pinned_bytes(t.nbytes());
    host_ = pinned_;
    if (copy_in) cuda::copy(pinned_, t.raw(), t.nbytes(), cuda::CopyKind::device_to_host);
#else
    (void)copy_in;
#endif
  }
  ~HostBuffer() { free_pinned_bytes(pinned_, tensor_.defined() ? tensor_.nbytes() : 0); }
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  void* get() const { return host_; }
  void copy_out() {  // results back to the device
#if COURSE_HAVE_CUDA
    if (pinned_) cuda::copy(tensor_.raw(), pinned_, tensor_.nbytes(), cuda::CopyKind::host_to_device);
#endif
  }

 private:
  Tensor tensor_;
  void* host_ = nullptr;
  void* pinned_ = nullptr;
};

MPI_Op mpi_op(ReduceOp op) { return op == ReduceOp::max ? MPI_MAX : MPI_SUM; }

// MPI has no 16-bit float type: 16-bit values (a bfloat16 or float16 tensor, or chapter 05's packed
// buffers) travel as MPI_UINT16_T. Reductions compute in float32 and round each partial result back to
// 16 bits, as a 16-bit reduction on the wire does (NCCL's among them): sums in the ring's order below
// (all-reduce and reduce-scatter), a reduce to one root and every max through these MPI operations.
float widen(std::uint16_t bits, HalfFormat format) {
  return format == HalfFormat::float16 ? half::from_float16(bits) : half::from_bfloat16(bits);
}
std::uint16_t narrow(float value, HalfFormat format) {
  return format == HalfFormat::float16 ? half::to_float16(value) : half::to_bfloat16(value);
}

template <HalfFormat format, bool maximum>
void reduce_16bit(void* in, void* inout, int* length, MPI_Datatype*) {
  const auto* a = static_cast<const std::uint16_t*>(in);
  auto* b = static_cast<std::uint16_t*>(inout);
  for (int i = 0; i < *length; ++i) {
    const float x = widen(a[i], format), y = widen(b[i], format);
    b[i] = narrow(maximum ? (x > y || std::isnan(x) ? x : y) : x + y, format);
  }
}

// Sums in the ring's order (algorithms::reduce_scatter_step, the schedule of every ring here): the values
// cut into a chunk a rank, chunk c added up from rank c + 1 round to rank c, a 16-bit partial sum rounded
// to 16 bits on its way, so that rank c ends with chunk c's sum. MPI's own reduction may bracket the
// terms as it likes (its algorithm changes with the size of the message and of the group), and beyond
// two ranks the brackets change the roundings; a fixed order lets a reference in one process
// (verify::LocalGroup) repeat a run's sums at any size. Every 16-bit sum goes this way, and a float32 one
// in a group that asked for it (Communicator::add_in_ring_order). `comm` carries nothing else, so its
// messages cannot meet a pipeline's sends. `Value`: float, or std::uint16_t holding `format`'s bits.
template <typename Value>
Value ring_add(Value a, Value b, HalfFormat format) {
  if constexpr (std::is_same_v<Value, float>) return a + b;
  else return narrow(widen(a, format) + widen(b, format), format);
}

template <typename Value>
void ring_reduce_scatter(Value* values, std::size_t count, HalfFormat format, MPI_Datatype type, MPI_Comm comm) {
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  std::vector<Value> incoming(algorithms::chunk_of(count, size, 0).size());  // chunk 0 is the largest
  const int next = (rank + 1) % size, previous = (rank + size - 1) % size;
  algorithms::for_each_reduce_scatter_step(rank, size, count, [&](int, algorithms::Chunk send, algorithms::Chunk receive) {
    check_mpi(MPI_Sendrecv(values + send.begin, static_cast<int>(send.size()), type, next, 0, incoming.data(),
                           static_cast<int>(receive.size()), type, previous, 0, comm, MPI_STATUS_IGNORE),
              "MPI_Sendrecv");
    for (std::size_t i = 0; i < receive.size(); ++i)
      values[receive.begin + i] = ring_add(incoming[i], values[receive.begin + i], format);
  });
}

// The same, then either every rank's chunk to every rank, in place (an all-reduce: `block` null), or this
// rank's chunk into `block` (a reduce-scatter's result): each value the sum of its ranks in the ring's order.
// On one machine the same sums travel through shared memory instead (SharedRing), in the same order.
template <typename Value>
void ring_sum(Value* values, std::size_t count, Value* block, HalfFormat format, MPI_Datatype type, MPI_Comm comm,
              SharedRing* shared) {
  if (shared) {
    shared->sum(values, count, block, [format](Value arriving, Value own) { return ring_add(arriving, own, format); });
    return;
  }
  ring_reduce_scatter(values, count, format, type, comm);
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  if (block) {
    const auto mine = algorithms::chunk_of(count, size, rank);
    std::copy(values + mine.begin, values + mine.end, block);
    return;
  }
  std::vector<int> counts(static_cast<std::size_t>(size)), offsets(static_cast<std::size_t>(size));
  for (int c = 0; c < size; ++c) {
    const auto chunk = algorithms::chunk_of(count, size, c);
    counts[static_cast<std::size_t>(c)] = static_cast<int>(chunk.size());
    offsets[static_cast<std::size_t>(c)] = static_cast<int>(chunk.begin);
  }
  check_mpi(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, values, counts.data(), offsets.data(), type, comm),
            "MPI_Allgatherv");
}

MPI_Op op_16bit(HalfFormat format, ReduceOp op) {
  static MPI_Op ops[2][2] = {{MPI_OP_NULL, MPI_OP_NULL}, {MPI_OP_NULL, MPI_OP_NULL}};
  static std::once_flag created;
  std::call_once(created, [] {
    MPI_Op_create(&reduce_16bit<HalfFormat::float16, false>, 1, &ops[0][0]);
    MPI_Op_create(&reduce_16bit<HalfFormat::float16, true>, 1, &ops[0][1]);
    MPI_Op_create(&reduce_16bit<HalfFormat::bfloat16, false>, 1, &ops[1][0]);
    MPI_Op_create(&reduce_16bit<HalfFormat::bfloat16, true>, 1, &ops[1][1]);
  });
  return ops[format == HalfFormat::bfloat16 ? 1 : 0][op == ReduceOp::max ? 1 : 0];
}

// How a collective's values travel: MPI's type, how many per tensor element, and the 16-bit format.
struct Wire {
  MPI_Datatype type = MPI_FLOAT;
  int per_element = 1;  // 2: chapter 05's packed buffers, two 16-bit values in each float32 slot
  bool sixteen_bit = false;
  HalfFormat format = HalfFormat::bfloat16;
};

Wire wire_of(const Collective& c) {
  const Tensor& t = c.input.defined() ? c.input : c.output;
  if (c.element != Element::float32)
    return {MPI_UINT16_T, 2, true, c.element == Element::float16 ? HalfFormat::float16 : HalfFormat::bfloat16};
  if (t.defined() && is_16bit(t.dtype())) return {MPI_UINT16_T, 1, true, half_format(t.dtype())};
  return {};
}

// ring_sum on the wire's values: float32, or 16-bit bits.
void ring_sum(const Wire& w, void* values, std::size_t count, void* block, MPI_Comm comm, SharedRing* shared) {
  if (w.sixteen_bit)
    ring_sum(static_cast<std::uint16_t*>(values), count, static_cast<std::uint16_t*>(block), w.format, MPI_UINT16_T, comm,
             shared);
  else
    ring_sum(static_cast<float*>(values), count, static_cast<float*>(block), w.format, MPI_FLOAT, comm, shared);
}

// From this many bytes a float32 sum of two ranks goes round the shared ring rather than to MPI_Allreduce
// (the same bits either way): 03's benchmark on 2 cores, 2026-11-29, the ring 1.1-1.6 times MPI's at 1 MiB
// and 2.0-2.8 times at 64 MiB (03_collectives/NOTES.md).
constexpr std::size_t kSharedRingTwoRanksFrom = 1 << 20;

class FutureWork final : public Work {
 public:
  explicit FutureWork(std::shared_future<void> f) : future_(std::move(f)) {}
  void wait() override { future_.get(); }
  bool test() override {
    if (future_.wait_for(std::chrono::seconds(0)) != std::future_status::ready) return false;
    future_.get();  // rethrows the collective's error, if any
    return true;
  }

 private:
  std::shared_future<void> future_;
};

// A non-blocking point-to-point transfer: MPI_Isend/MPI_Irecv on a host buffer (pinned, for a CUDA
// tensor), copied back to the device when a receive completes.
class RequestWork final : public Work {
 public:
  RequestWork(const Tensor& tensor, bool receive) : buffer_(tensor, !receive), receive_(receive) {}
  ~RequestWork() override {
    if (!done_) MPI_Wait(&request_, MPI_STATUS_IGNORE);  // never free a buffer MPI still uses
  }
  void wait() override {
    if (done_) return;
    check_mpi(MPI_Wait(&request_, MPI_STATUS_IGNORE), "MPI_Wait");
    finish();
  }
  bool test() override {
    if (done_) return true;
    int flag = 0;
    check_mpi(MPI_Test(&request_, &flag, MPI_STATUS_IGNORE), "MPI_Test");
    if (flag) finish();
    return done_;
  }
  void* host() const { return buffer_.get(); }
  MPI_Request* request() { return &request_; }

 private:
  void finish() {
    done_ = true;
    if (receive_) buffer_.copy_out();
  }
  HostBuffer buffer_;
  bool receive_;
  MPI_Request request_ = MPI_REQUEST_NULL;
  bool done_ = false;
};

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(MPI_Comm comm, const Placement& placement)
      : Communicator(placement), comm_(comm), gpu_(creator_gpu()), worker_([this] { run_worker(); }) {}

  ~MpiCommunicator() override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    ready_.notify_one();
    worker_.join();
    if (ring_ != MPI_COMM_NULL) MPI_Comm_free(&ring_);
    MPI_Comm_free(&comm_);
  }

  std::string backend_name() const override { return "mpi"; }

  std::unique_ptr<Communicator> split_group(int color, int key) override {
    MPI_Comm sub = MPI_COMM_NULL;
    enqueue([&] { check_mpi(MPI_Comm_split(comm_, color, key, &sub), "MPI_Comm_split"); }).get();
    Placement p = placement();
    MPI_Comm_rank(sub, &p.rank);
    MPI_Comm_size(sub, &p.size);
    return std::make_unique<MpiCommunicator>(sub, p);
  }

 protected:
  WorkHandle start(const Collective& c) override {
    // Point to point runs from the calling thread, in its order; matching by (peer, tag) keeps it
    // apart from the collectives on the communication thread.
    if (c.kind == OpKind::send || c.kind == OpKind::recv) {
      const bool receive = c.kind == OpKind::recv;
      auto work = std::make_shared<RequestWork>(receive ? c.output : c.input, receive);
      const Wire w = wire_of(c);
      if (receive)
        check_mpi(MPI_Irecv(work->host(), count_of(c.output), w.type, c.peer, c.tag, comm_, work->request()), "MPI_Irecv");
      else
        check_mpi(MPI_Isend(work->host(), count_of(c.input), w.type, c.root, c.tag, comm_, work->request()), "MPI_Isend");
      return work;
    }
    if (c.kind == OpKind::send_recv) {
      std::promise<void> done;
      run(c);
      done.set_value();
      return std::make_shared<FutureWork>(done.get_future().share());
    }
    // The task lets go of the tensors before the work reads as complete: a caller that frees them
    // after wait() must see their memory freed (chapter 07 counts it), not held until the
    // communication thread gets round to destroying the finished task.
    auto held = std::make_shared<Collective>(c);
    return std::make_shared<FutureWork>(enqueue([this, held]() mutable {
      run(*held);
      held.reset();
    }));
  }

 private:

  std::shared_future<void> enqueue(std::function<void()> task) {
    auto packaged = std::make_shared<std::packaged_task<void()>>(std::move(task));
    auto future = packaged->get_future().share();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      queue_.push_back([packaged] { (*packaged)(); });
    }
    ready_.notify_one();
    return future;
  }

  // The GPU the creating thread uses, or -1. CUDA's current device is per thread, and the
  // communication thread stages CUDA tensors: without this it would work on (and create a context
  // on) GPU 0 in every rank.
  static int creator_gpu() {
#if COURSE_HAVE_CUDA
    if (cuda_device_count() > 0) return cuda::current_device();
#endif
    return -1;
  }

  void run_worker() {
#if COURSE_HAVE_CUDA
    if (gpu_ >= 0) cuda::set_device(gpu_);
#endif
    for (;;) {
      std::function<void()> task;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        ready_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
        if (queue_.empty()) return;
        task = std::move(queue_.front());
        queue_.pop_front();
      }
      task();
    }
  }

  void run(const Collective& c) {
    const bool in_place = c.input.defined() && c.output.defined() && c.input.impl() == c.output.impl();
    HostBuffer in(c.input, true);
    HostBuffer out(in_place ? Tensor() : c.output, false);  // outputs are written whole
    void* inp = in.get();
    void* outp = in_place ? in.get() : out.get();
    const Wire w = wire_of(c);
    const int n_in = count_of(c.input, w.per_element), n_out = count_of(c.output, w.per_element);
    const MPI_Op op = w.sixteen_bit ? op_16bit(w.format, c.op) : mpi_op(c.op);
    // A 16-bit average multiplies each rank's values by 1/N (rounded to 16 bits) before they are added,
    // as NCCL's ncclAvg does for floating types (its PreMulSum): the partial sums then stay within the
    // values' range, so the average of finite float16 values never overflows where their sum would.
    std::vector<std::uint16_t> premultiplied;
    const bool premultiply = w.sixteen_bit && c.op == ReduceOp::average;
    if (premultiply) {
      const auto* bits = static_cast<const std::uint16_t*>(inp);
      const float inverse = 1.0f / static_cast<float>(size());
      premultiplied.resize(static_cast<std::size_t>(n_in));
      for (int i = 0; i < n_in; ++i) premultiplied[static_cast<std::size_t>(i)] = narrow(widen(bits[i], w.format) * inverse, w.format);
    }
    const bool divide = c.op == ReduceOp::average && !premultiply;  // float32: the sum divided once
    // Sums in the ring's order (ring_reduce_scatter), on a communicator of their own: every 16-bit one,
    // and a float32 one where the group asked for it. At two ranks, where two values add alike in either
    // order, only where the ring is faster than MPI_Allreduce: through shared memory, from
    // kSharedRingTwoRanksFrom bytes (below, MPI's one exchange beats the ring's two steps).
    const bool summed = c.op != ReduceOp::max && (c.kind == OpKind::all_reduce || c.kind == OpKind::reduce_scatter);
    if (summed && (w.sixteen_bit || c.ring_order) && ring_ == MPI_COMM_NULL) {
      check_mpi(MPI_Comm_dup(comm_, &ring_), "MPI_Comm_dup");
      if (size() > 1) shared_ = SharedRing::open(ring_);
    }
    const bool large = static_cast<std::size_t>(n_in) * 4 >= kSharedRingTwoRanksFrom;
    const bool ring = summed && (w.sixteen_bit || (c.ring_order && (size() > 2 || (shared_ && large))));
    switch (c.kind) {
      case OpKind::broadcast:
        check_mpi(MPI_Bcast(inp, n_in, w.type, c.root, comm_), "MPI_Bcast");
        break;
      case OpKind::reduce:
        check_mpi(MPI_Reduce(premultiply ? premultiplied.data() : rank() == c.root ? MPI_IN_PLACE : inp, inp, n_in, w.type, op,
                             c.root, comm_),
                  "MPI_Reduce");
        if (divide && rank() == c.root) average(inp, n_in);
        break;
      case OpKind::all_reduce:
        if (ring) {
          if (premultiply) std::copy(premultiplied.begin(), premultiplied.end(), static_cast<std::uint16_t*>(inp));
          ring_sum(w, inp, static_cast<std::size_t>(n_in), nullptr, ring_, shared_.get());
        } else {
          check_mpi(MPI_Allreduce(premultiply ? premultiplied.data() : MPI_IN_PLACE, inp, n_in, w.type, op, comm_),
                    "MPI_Allreduce");
        }
        if (divide) average(inp, n_in);
        break;
      case OpKind::all_gather:
        check_mpi(MPI_Allgather(inp, n_in, w.type, outp, n_in, w.type, comm_), "MPI_Allgather");
        break;
      case OpKind::reduce_scatter:
        if (ring) {  // the sums made in a copy: the input stays as it was
          const std::size_t bytes = static_cast<std::size_t>(n_in) * (w.sixteen_bit ? 2 : 4);
          std::vector<unsigned char> sums(bytes);
          if (bytes) std::memcpy(sums.data(), premultiply ? static_cast<const void*>(premultiplied.data()) : inp, bytes);
          ring_sum(w, sums.data(), static_cast<std::size_t>(n_in), outp, ring_, shared_.get());
        } else {
          check_mpi(MPI_Reduce_scatter_block(premultiply ? premultiplied.data() : inp, outp, n_out, w.type, op, comm_),
                    "MPI_Reduce_scatter_block");
        }
        if (divide) average(outp, n_out);
        break;
      case OpKind::scatter:
        check_mpi(MPI_Scatter(inp, n_out, w.type, outp, n_out, w.type, c.root, comm_), "MPI_Scatter");
        break;
      case OpKind::gather:
        check_mpi(MPI_Gather(inp, n_in, w.type, outp, n_in, w.type, c.root, comm_), "MPI_Gather");
        break;
      case OpKind::all_to_all:
        check_mpi(MPI_Alltoall(inp, n_in / size(), w.type, outp, n_out / size(), w.type, comm_), "MPI_Alltoall");
        break;
      case OpKind::barrier:
        check_mpi(MPI_Barrier(comm_), "MPI_Barrier");
        break;
      case OpKind::send:
      case OpKind::recv:
        break;  // non-blocking, see start()
      case OpKind::send_recv:
        check_mpi(MPI_Sendrecv(inp, n_in, w.type, c.root, c.tag, outp, n_out, w.type, c.peer, c.tag, comm_,
                               MPI_STATUS_IGNORE),
                  "MPI_Sendrecv");
        break;
    }
    if (in_place) in.copy_out();
    else out.copy_out();
  }

  void average(void* data, int n) {
    auto* values = static_cast<float*>(data);
    kernels(Device::cpu).scale(values, 1.0f / static_cast<float>(size()), values, static_cast<std::size_t>(n));
  }

  MPI_Comm comm_;
  MPI_Comm ring_ = MPI_COMM_NULL;  // the ring's sums' own (ring_reduce_scatter), made at the first
  std::unique_ptr<SharedRing> shared_;  // with it, at the first: null where memory cannot be shared
  int gpu_;
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<std::function<void()>> queue_;
  bool stopping_ = false;
  std::thread worker_;  // declared last: it starts after everything it uses
};

}  // namespace

std::unique_ptr<Communicator> make_mpi_communicator(const Placement& world) {
  MPI_Comm comm;
  check_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &comm), "MPI_Comm_dup");
  return std::make_unique<MpiCommunicator>(comm, world);
}

}  // namespace course::comm
