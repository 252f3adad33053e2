// The clusters the planner knows (cluster.h).
#include "common/planner/cluster.h"

#include "common/planner/published.h"

namespace course::planner {

Cluster dgx_a100(int nodes) {
  Cluster c;
  c.name = "DGX A100 80GB x " + std::to_string(nodes);
  c.gpus_per_node = 8;
  c.nodes = nodes;
  // NVIDIA's A100 datasheet: 312 TFLOP/s dense bf16/fp16 on tensor cores, 19.5 without them in fp32,
  // 80 GB of HBM2e at 2,039 GB/s.
  c.device.name = "A100 80GB";
  c.device.peak_flops_16 = kA100PeakFlops;
  c.device.peak_flops_32 = 19.5e12;
  c.device.memory_bytes = 80.0 * (1ull << 30);
  c.device.memory_bandwidth = 2.039e12;
  // Not measured here (no A100 is at hand): a training step's largest half-precision GEMMs run at about
  // 70% of the peak (cuBLAS at the clocks a GPU holds under sustained load), and a GEMM of 2 GFLOP (1,000
  // cubed) at about half of that, its launch and its tiles' edges counting as much as its work.
  // bench_matmul measures both on a lent GPU.
  c.device.gemm_efficiency = 0.7;
  c.device.half_efficiency_flops = 2e9;
  // NVLink 3 through NVSwitch: 300 GB/s each way a GPU, of which a ring's collectives move about 80%;
  // HDR InfiniBand: 200 Gb/s, 25 GB/s, an adapter a GPU, about 80% of it in practice.
  c.intra = {5e-6, 0.8 * 300e9};
  c.inter = {10e-6, 0.8 * 25e9};
  return c;
}

}  // namespace course::planner
