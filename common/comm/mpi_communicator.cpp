// The MPI backend. Collectives run on a communication thread that owns their order, so the async
// forms really proceed in the background while the caller computes (Open MPI makes no progress on
// non-blocking collectives between calls). CUDA tensors are staged through pinned host buffers,
// because Debian's Open MPI is not CUDA-aware.
#include <mpi.h>

#include <condition_variable>
#include <deque>
#include <functional>
#include <limits>
#include <future>
#include <mutex>
#include <stdexcept>
#include <thread>

#include "common/comm/backends.h"
#include "common/core/cuda_runtime.h"
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

int count_of(const Tensor& t) {
  if (!t.defined()) return 0;
  if (t.numel() > std::numeric_limits<int>::max()) throw std::invalid_argument("tensor too large for one MPI call");
  return static_cast<int>(t.numel());
}

// A host pointer for a tensor: the tensor itself on the CPU, a pinned copy for a CUDA tensor.
class HostBuffer {
 public:
  HostBuffer(const Tensor& t, bool copy_in) : tensor_(t) {
    if (!t.defined() || t.device() == Device::cpu) {
      host_ = t.defined() ? t.data() : nullptr;
      return;
    }
#if COURSE_HAVE_CUDA
    pinned_ = static_cast<float*>(allocate_pinned_bytes(t.nbytes()));
    host_ = pinned_;
    if (copy_in) cuda::copy(pinned_, t.data(), t.nbytes(), cuda::CopyKind::device_to_host);
#else
    (void)copy_in;
#endif
  }
  ~HostBuffer() { free_pinned_bytes(pinned_, tensor_.defined() ? tensor_.nbytes() : 0); }
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  float* get() const { return host_; }
  void copy_out() {  // results back to the device
#if COURSE_HAVE_CUDA
    if (pinned_) cuda::copy(tensor_.data(), pinned_, tensor_.nbytes(), cuda::CopyKind::host_to_device);
#endif
  }

 private:
  Tensor tensor_;
  float* host_ = nullptr;
  float* pinned_ = nullptr;
};

MPI_Op mpi_op(ReduceOp op) { return op == ReduceOp::max ? MPI_MAX : MPI_SUM; }

// MPI has no 16-bit float type: sums of packed fp16 or bf16 travel as MPI_UINT16_T with these
// operations, which add in float32 and round each partial sum back to 16 bits, as a 16-bit
// all-reduce on the wire does.
template <HalfFormat format>
void add_16bit(void* in, void* inout, int* length, MPI_Datatype*) {
  const auto* a = static_cast<const std::uint16_t*>(in);
  auto* b = static_cast<std::uint16_t*>(inout);
  for (int i = 0; i < *length; ++i) {
    if constexpr (format == HalfFormat::float16) b[i] = half::to_float16(half::from_float16(a[i]) + half::from_float16(b[i]));
    else b[i] = half::to_bfloat16(half::from_bfloat16(a[i]) + half::from_bfloat16(b[i]));
  }
}

MPI_Op sum_16bit(Element element) {
  static MPI_Op fp16 = MPI_OP_NULL, bf16 = MPI_OP_NULL;
  static std::once_flag created;
  std::call_once(created, [] {
    MPI_Op_create(&add_16bit<HalfFormat::float16>, 1, &fp16);
    MPI_Op_create(&add_16bit<HalfFormat::bfloat16>, 1, &bf16);
  });
  return element == Element::float16 ? fp16 : bf16;
}

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
  float* host() const { return buffer_.get(); }
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
      if (receive)
        check_mpi(MPI_Irecv(work->host(), count_of(c.output), MPI_FLOAT, c.peer, c.tag, comm_, work->request()), "MPI_Irecv");
      else
        check_mpi(MPI_Isend(work->host(), count_of(c.input), MPI_FLOAT, c.root, c.tag, comm_, work->request()), "MPI_Isend");
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
    float* inp = in.get();
    float* outp = in_place ? in.get() : out.get();
    int n_in = count_of(c.input), n_out = count_of(c.output);
    switch (c.kind) {
      case OpKind::broadcast:
        check_mpi(MPI_Bcast(inp, n_in, MPI_FLOAT, c.root, comm_), "MPI_Bcast");
        break;
      case OpKind::reduce:
        check_mpi(MPI_Reduce(rank() == c.root ? MPI_IN_PLACE : inp, inp, n_in, MPI_FLOAT, mpi_op(c.op), c.root, comm_),
                  "MPI_Reduce");
        if (c.op == ReduceOp::average && rank() == c.root) average(inp, n_in);
        break;
      case OpKind::all_reduce:
        if (c.element != Element::float32) {
          if (n_in > std::numeric_limits<int>::max() / 2) throw std::invalid_argument("tensor too large for one MPI call");
          check_mpi(MPI_Allreduce(MPI_IN_PLACE, inp, 2 * n_in, MPI_UINT16_T, sum_16bit(c.element), comm_), "MPI_Allreduce");
          break;
        }
        check_mpi(MPI_Allreduce(MPI_IN_PLACE, inp, n_in, MPI_FLOAT, mpi_op(c.op), comm_), "MPI_Allreduce");
        if (c.op == ReduceOp::average) average(inp, n_in);
        break;
      case OpKind::all_gather:
        check_mpi(MPI_Allgather(inp, n_in, MPI_FLOAT, outp, n_in, MPI_FLOAT, comm_), "MPI_Allgather");
        break;
      case OpKind::reduce_scatter:
        check_mpi(MPI_Reduce_scatter_block(inp, outp, n_out, MPI_FLOAT, mpi_op(c.op), comm_), "MPI_Reduce_scatter_block");
        if (c.op == ReduceOp::average) average(outp, n_out);
        break;
      case OpKind::scatter:
        check_mpi(MPI_Scatter(inp, n_out, MPI_FLOAT, outp, n_out, MPI_FLOAT, c.root, comm_), "MPI_Scatter");
        break;
      case OpKind::gather:
        check_mpi(MPI_Gather(inp, n_in, MPI_FLOAT, outp, n_in, MPI_FLOAT, c.root, comm_), "MPI_Gather");
        break;
      case OpKind::barrier:
        check_mpi(MPI_Barrier(comm_), "MPI_Barrier");
        break;
      case OpKind::send:
      case OpKind::recv:
        break;  // non-blocking, see start()
      case OpKind::send_recv:
        check_mpi(MPI_Sendrecv(inp, n_in, MPI_FLOAT, c.root, c.tag, outp, n_out, MPI_FLOAT, c.peer, c.tag, comm_,
                               MPI_STATUS_IGNORE),
                  "MPI_Sendrecv");
        break;
    }
    if (in_place) in.copy_out();
    else out.copy_out();
  }

  void average(float* data, int n) {
    kernels(Device::cpu).scale(data, 1.0f / static_cast<float>(size()), data, static_cast<std::size_t>(n));
  }

  MPI_Comm comm_;
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
