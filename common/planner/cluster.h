// A cluster as the planner sees it: identical nodes of a few GPUs each, every GPU's compute and memory,
// and two links, one inside a node and one between nodes, each as Hockney's alpha-beta model (a message of
// n bytes takes alpha + n / bandwidth; chapter 03 fits the two on this machine).
#pragma once
#include <string>

#include "common/core/dtype.h"

namespace course::planner {

struct Link {
  double alpha_seconds = 0;     // the latency of one message
  double bytes_per_second = 0;  // what one GPU's messages move, once started
  double seconds(double bytes) const { return alpha_seconds + bytes / bytes_per_second; }
};

// One accelerator. A GEMM of F FLOPs runs at gemm_efficiency x F / (F + half_efficiency_flops) of the
// peak: large products approach the library's best, small ones pay their launch and their tiles' edges
// (the curve a GEMM benchmark traces, bench_matmul). Element-wise work (layer norms, softmax, GeLU,
// dropout, the residual adds) is bound by memory bandwidth instead.
struct DeviceProfile {
  std::string name;
  double peak_flops_16 = 0;   // dense bfloat16 / float16 products (tensor cores)
  double peak_flops_32 = 0;   // float32 products without TF32
  double gemm_efficiency = 0;          // of the peak, on the largest GEMMs
  double half_efficiency_flops = 0;    // a GEMM this large runs at half of gemm_efficiency
  double memory_bytes = 0;
  double memory_bandwidth = 0;  // bytes per second
  // What a CPU's measured ops cost beyond the above (calibration.h); zero on the DGX presets, where a
  // kernel's launch (microseconds) is far below a layer's GEMMs (milliseconds) and element-wise work is
  // bound by the memory's bandwidth. Each forward and backward:
  double op_seconds = 0;                       // one op's fixed cost (the ops outside the layers)
  double elementwise_fixed_seconds = 0;        // a layer's element-wise ops: fixed part
  double elementwise_seconds_per_element = 0;  // and per token-channel (GELU's arithmetic)
  double attention_seconds_per_head = 0;       // attention per sequence-head pair
  double peak(DType precision) const { return precision == DType::float32 ? peak_flops_32 : peak_flops_16; }
};

struct Cluster {
  std::string name;
  DeviceProfile device;
  int gpus_per_node = 1;
  int nodes = 1;
  Link intra;  // between two GPUs of a node (NVLink)
  Link inter;  // between nodes (InfiniBand; per GPU: a node's adapters shared by its GPUs)
  int gpus() const { return gpus_per_node * nodes; }
};

// NVIDIA's DGX A100 (80 GB) nodes as in Megatron-LM 2021's Selene: 8 GPUs joined by NVSwitch, 8 HDR
// InfiniBand adapters of 200 Gb/s a node (25 GB/s a GPU). Sources and assumptions in cluster.cpp.
Cluster dgx_a100(int nodes);

// NVIDIA's DGX H100 nodes: 8 H100 SXM GPUs joined by NVSwitch (NVLink 4), an NDR InfiniBand adapter of
// 400 Gb/s a GPU. The same assumptions as the A100's where nothing was measured (cluster.cpp).
Cluster dgx_h100(int nodes);

// A preset by name ("dgx-a100", "dgx-h100") of `nodes` nodes; throws std::invalid_argument otherwise.
Cluster cluster_named(const std::string& name, int nodes);

}  // namespace course::planner
