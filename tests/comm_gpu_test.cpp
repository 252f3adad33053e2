// CUDA tensors over the MPI backend (staged through pinned host memory), and over NCCL where each rank
// has a GPU: every collective and algorithm against the same computation on CPU tensors.
// Skips, saying why, where no GPU is usable.
#include <gtest/gtest.h>

#include "common/comm/algorithms.h"
#include "support/mpi_main.h"

namespace course::testing {
namespace {

namespace algo = comm::algorithms;

#define SKIP_WITHOUT_GPU()                                                      \
  do {                                                                          \
    std::string reason;                                                         \
    if (!cuda_usable(&reason)) GTEST_SKIP() << "no usable GPU: " << reason;     \
  } while (0)

Tensor rank_tensor(std::size_t n, int rank, Device device) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<float>((rank + 1) * static_cast<int>(i % 13 + 1));
  return Tensor::from_host(v, {static_cast<std::int64_t>(n)}, device);
}

TEST(CudaOverMpi, CollectivesMatchTheCpuResult) {
  SKIP_WITHOUT_GPU();
  select_device("cuda", world().local_rank(), false);
  const int me = world().rank(), n = world().size();
  for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{1000003}}) {
    Tensor cpu = rank_tensor(count, me, Device::cpu), gpu = rank_tensor(count, me, Device::cuda);
    world().all_reduce(cpu);
    world().all_reduce(gpu);
    EXPECT_EQ(gpu.to_host(), cpu.to_host()) << "all_reduce " << count;
    Tensor ring = rank_tensor(count, me, Device::cuda);
    algo::ring_all_reduce(world(), ring);
    EXPECT_EQ(ring.to_host(), cpu.to_host()) << "ring_all_reduce " << count;
    Tensor tree = rank_tensor(count, me, Device::cuda);
    algo::tree_broadcast(world(), tree, n - 1);
    EXPECT_EQ(tree.to_host(), rank_tensor(count, n - 1, Device::cpu).to_host()) << "tree_broadcast " << count;
    Tensor gathered_gpu = Tensor::zeros({static_cast<std::int64_t>(count) * n}, Device::cuda);
    Tensor gathered_cpu = Tensor::zeros({static_cast<std::int64_t>(count) * n});
    world().all_gather(rank_tensor(count, me, Device::cuda), gathered_gpu);
    world().all_gather(rank_tensor(count, me, Device::cpu), gathered_cpu);
    EXPECT_EQ(gathered_gpu.to_host(), gathered_cpu.to_host()) << "all_gather " << count;
    Tensor spread_gpu = Tensor::zeros({static_cast<std::int64_t>(count) * n}, Device::cuda);
    Tensor spread_cpu = Tensor::zeros({static_cast<std::int64_t>(count) * n});
    world().all_to_all(gathered_gpu, spread_gpu);
    world().all_to_all(gathered_cpu, spread_cpu);
    EXPECT_EQ(spread_gpu.to_host(), spread_cpu.to_host()) << "all_to_all " << count;
  }
}

TEST(CudaOverMpi, AsyncAllReduceOfDeviceTensors) {
  SKIP_WITHOUT_GPU();
  select_device("cuda", world().local_rank(), false);
  Tensor t = rank_tensor(4096, world().rank(), Device::cuda);
  auto work = world().all_reduce_async(t, comm::ReduceOp::average);
  work->wait();
  const float mean_rank_factor = static_cast<float>(world().size() + 1) / 2.0f;
  EXPECT_FLOAT_EQ(t.to_host()[0], mean_rank_factor);
}

}  // namespace
}  // namespace course::testing

COURSE_MPI_TEST_MAIN()
