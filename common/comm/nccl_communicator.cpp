// The NCCL backend: collectives on a communication stream, ordered after the compute stream by an
// event, and completed through another event, so backward can run while gradients travel.
#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>

#include <stdexcept>
#include <string>

#include "common/comm/backends.h"

namespace course::comm {
namespace {

void check_nccl(ncclResult_t result, const char* call) {
  if (result != ncclSuccess) throw std::runtime_error(std::string(call) + ": " + ncclGetErrorString(result));
}
void check_cuda(cudaError_t err, const char* call) {
  if (err != cudaSuccess) throw std::runtime_error(std::string(call) + ": " + cudaGetErrorString(err));
}

ncclRedOp_t nccl_op(ReduceOp op) {
  return op == ReduceOp::sum ? ncclSum : op == ReduceOp::average ? ncclAvg : ncclMax;
}

class EventWork final : public Work {
 public:
  explicit EventWork(cudaEvent_t done) : done_(done) {}
  ~EventWork() override { cudaEventDestroy(done_); }
  void wait() override { check_cuda(cudaEventSynchronize(done_), "cudaEventSynchronize"); }
  bool test() override { return cudaEventQuery(done_) == cudaSuccess; }

 private:
  cudaEvent_t done_;
};

class DoneWork final : public Work {
 public:
  void wait() override {}
  bool test() override { return true; }
};

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(ncclComm_t comm, const Placement& placement) : Communicator(placement), comm_(comm) {
    check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    check_cuda(cudaMalloc(&scratch_, sizeof(float)), "cudaMalloc");
  }
  ~NcclCommunicator() override {
    cudaStreamSynchronize(stream_);
    ncclCommDestroy(comm_);
    cudaStreamDestroy(stream_);
    cudaFree(scratch_);
  }
  std::string backend_name() const override { return "nccl"; }

  std::unique_ptr<Communicator> split_group(int color, int key) override {
    ncclComm_t sub = nullptr;
    check_nccl(ncclCommSplit(comm_, color, key, &sub, nullptr), "ncclCommSplit");
    Placement p = placement();
    check_nccl(ncclCommUserRank(sub, &p.rank), "ncclCommUserRank");
    check_nccl(ncclCommCount(sub, &p.size), "ncclCommCount");
    return std::make_unique<NcclCommunicator>(sub, p);
  }

 protected:
  WorkHandle start(const Collective& c) override {
    bool on_host = false;
    for (const Tensor* t : {&c.input, &c.output}) on_host = on_host || (t->defined() && t->device() == Device::cpu);
    if (on_host) return start_staged(c);
    cudaEvent_t ready, done;
    check_cuda(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming), "cudaEventCreate");
    check_cuda(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), "cudaEventCreate");
    check_cuda(cudaEventRecord(ready, 0), "cudaEventRecord");  // after the compute that wrote the inputs
    check_cuda(cudaStreamWaitEvent(stream_, ready, 0), "cudaStreamWaitEvent");
    cudaEventDestroy(ready);
    launch(c);
    check_cuda(cudaEventRecord(done, stream_), "cudaEventRecord");
    return std::make_shared<EventWork>(done);
  }

 private:
  void launch(const Collective& c) {
    // Any element type: NCCL reduces float16 and bfloat16 itself. Chapter 05's packed buffers hold two
    // 16-bit values in each float32 slot.
    const Tensor& typed = c.input.defined() ? c.input : c.output;
    ncclDataType_t type = ncclFloat;
    size_t per_element = 1;
    if (c.element != Element::float32) {
      type = c.element == Element::float16 ? ncclFloat16 : ncclBfloat16;
      per_element = 2;
    } else if (typed.defined() && typed.dtype() != DType::float32) {
      type = typed.dtype() == DType::float16 ? ncclFloat16 : ncclBfloat16;
    }
    const size_t item = c.element != Element::float32 ? 2 : (typed.defined() ? typed.element_size() : 4);
    const char* in = c.input.defined() ? static_cast<const char*>(c.input.raw()) : nullptr;
    char* out = c.output.defined() ? static_cast<char*>(c.output.raw()) : nullptr;
    size_t n_in = c.input.defined() ? static_cast<size_t>(c.input.numel()) * per_element : 0;
    size_t n_out = c.output.defined() ? static_cast<size_t>(c.output.numel()) * per_element : 0;
    switch (c.kind) {
      case OpKind::broadcast:
        check_nccl(ncclBroadcast(in, out, n_in, type, c.root, comm_, stream_), "ncclBroadcast");
        break;
      case OpKind::reduce:
        check_nccl(ncclReduce(in, out, n_in, type, nccl_op(c.op), c.root, comm_, stream_), "ncclReduce");
        break;
      case OpKind::all_reduce:
        check_nccl(ncclAllReduce(in, out, n_in, type, nccl_op(c.op), comm_, stream_), "ncclAllReduce");
        break;
      case OpKind::all_gather:
        check_nccl(ncclAllGather(in, out, n_in, type, comm_, stream_), "ncclAllGather");
        break;
      case OpKind::reduce_scatter:
        check_nccl(ncclReduceScatter(in, out, n_out, type, nccl_op(c.op), comm_, stream_), "ncclReduceScatter");
        break;
      case OpKind::scatter:  // NCCL has no scatter: the root sends each rank its slice in one group
        check_nccl(ncclGroupStart(), "ncclGroupStart");
        if (rank() == c.root)
          for (int r = 0; r < size(); ++r) check_nccl(ncclSend(in + r * n_out * item, n_out, type, r, comm_, stream_), "ncclSend");
        check_nccl(ncclRecv(out, n_out, type, c.root, comm_, stream_), "ncclRecv");
        check_nccl(ncclGroupEnd(), "ncclGroupEnd");
        break;
      case OpKind::gather:
        check_nccl(ncclGroupStart(), "ncclGroupStart");
        if (rank() == c.root)
          for (int r = 0; r < size(); ++r) check_nccl(ncclRecv(out + r * n_in * item, n_in, type, r, comm_, stream_), "ncclRecv");
        check_nccl(ncclSend(in, n_in, type, c.root, comm_, stream_), "ncclSend");
        check_nccl(ncclGroupEnd(), "ncclGroupEnd");
        break;
      case OpKind::all_to_all:  // NCCL has no all-to-all: every pair exchanges its slices in one group
        check_nccl(ncclGroupStart(), "ncclGroupStart");
        for (int r = 0; r < size(); ++r) {
          const size_t slice = n_in / static_cast<size_t>(size());
          check_nccl(ncclSend(in + r * slice * item, slice, type, r, comm_, stream_), "ncclSend");
          check_nccl(ncclRecv(out + r * slice * item, slice, type, r, comm_, stream_), "ncclRecv");
        }
        check_nccl(ncclGroupEnd(), "ncclGroupEnd");
        break;
      case OpKind::barrier:  // an all-reduce of one value: every rank must arrive before any leaves
        check_nccl(ncclAllReduce(scratch_, scratch_, 1, ncclFloat, ncclSum, comm_, stream_), "ncclAllReduce");
        break;
      case OpKind::send:
        check_nccl(ncclSend(in, n_in, type, c.root, comm_, stream_), "ncclSend");
        break;
      case OpKind::recv:
        check_nccl(ncclRecv(out, n_out, type, c.peer, comm_, stream_), "ncclRecv");
        break;
      case OpKind::send_recv:
        check_nccl(ncclGroupStart(), "ncclGroupStart");
        check_nccl(ncclSend(in, n_in, type, c.root, comm_, stream_), "ncclSend");
        check_nccl(ncclRecv(out, n_out, type, c.peer, comm_, stream_), "ncclRecv");
        check_nccl(ncclGroupEnd(), "ncclGroupEnd");
        break;
    }
  }

  // NCCL moves device memory only: CPU tensors (losses, checksums, flags) travel through device
  // copies, and the call completes before it returns.
  WorkHandle start_staged(const Collective& c) {
    MemoryCategoryScope scope(MemoryCategory::communication);
    const bool in_place = c.input.defined() && c.output.defined() && c.input.impl() == c.output.impl();
    Collective staged = c;
    if (c.input.defined()) staged.input = c.input.to(Device::cuda);
    if (in_place) staged.output = staged.input;
    else if (c.output.defined()) staged.output = c.output.to(Device::cuda);
    start(staged)->wait();
    if (c.output.defined()) {
      Tensor host = c.output;  // a handle to the caller's storage
      host.copy_from(staged.output);
    }
    return std::make_shared<DoneWork>();
  }

  ncclComm_t comm_;
  cudaStream_t stream_ = nullptr;
  float* scratch_ = nullptr;
};

}  // namespace

// Rank 0 makes the unique id and MPI broadcasts it; the GPU was chosen by select_device.
std::unique_ptr<Communicator> make_nccl_communicator(const Placement& world) {
  ncclUniqueId id;
  if (world.rank == 0) check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
  MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
  ncclComm_t comm;
  check_nccl(ncclCommInitRank(&comm, world.size, id, world.rank), "ncclCommInitRank");
  return std::make_unique<NcclCommunicator>(comm, world);
}

}  // namespace course::comm
