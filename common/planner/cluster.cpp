// The clusters the planner knows (cluster.h).
#include "common/planner/cluster.h"

#include <stdexcept>

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

Cluster dgx_h100(int nodes) {
  Cluster c = dgx_a100(nodes);
  c.name = "DGX H100 x " + std::to_string(nodes);
  // NVIDIA's H100 SXM datasheet: 989 TFLOP/s dense bf16/fp16, 67 in float32 without tensor cores, 80 GB
  // of HBM3 at 3.35 TB/s. The GEMM curve keeps the A100's shape: the same 70% on the largest products,
  // and half of it at a GEMM as many times larger as the peak is (a launch costs the same time).
  c.device.name = "H100 SXM";
  c.device.peak_flops_16 = 989e12;
  c.device.peak_flops_32 = 67e12;
  c.device.memory_bandwidth = 3.35e12;
  c.device.half_efficiency_flops = 2e9 * 989e12 / kA100PeakFlops;
  // NVLink 4: 450 GB/s each way a GPU; NDR InfiniBand: 400 Gb/s, 50 GB/s, an adapter a GPU; 80% of each.
  c.intra = {5e-6, 0.8 * 450e9};
  c.inter = {10e-6, 0.8 * 50e9};
  return c;
}

Cluster cluster_named(const std::string& name, int nodes) {
  if (name == "dgx-a100") return dgx_a100(nodes);
  if (name == "dgx-h100") return dgx_h100(nodes);
  throw std::invalid_argument("no cluster named '" + name + "' (dgx-a100, dgx-h100)");
}

}  // namespace course::planner
