// Model FLOPs utilisation: nanoGPT's count of a GPT's FLOPs and a table of GPUs' peaks.
#include "common/metrics/mfu.h"

#include <vector>

namespace course::metrics {

double gpt_flops_per_token(const GptFlopsShape& s) {
  const double n = static_cast<double>(s.parameters - s.position_parameters);
  const double q = s.n_head ? static_cast<double>(s.n_embd) / static_cast<double>(s.n_head) : 0.0;
  return 6.0 * n + 12.0 * static_cast<double>(s.n_layer) * static_cast<double>(s.n_head) * q * static_cast<double>(s.block_size);
}

namespace {

// Dense TFLOP/s from NVIDIA's datasheets: 16-bit tensor cores, TF32 tensor cores, float32 CUDA cores. The
// first entry whose every word is in the device's name applies, so the more specific names come first.
struct Peak {
  std::vector<std::string> words;
  double sixteen_bit, tf32, float32;
};
const std::vector<Peak>& peaks() {
  static const std::vector<Peak> table = {
      {{"H200"}, 989.4, 494.7, 66.9},          // H200 SXM
      {{"H100", "PCIe"}, 756.0, 378.0, 51.2},  // H100 PCIe
      {{"H100", "NVL"}, 835.0, 417.5, 59.8},   // H100 NVL, per GPU
      {{"H100"}, 989.4, 494.7, 66.9},          // H100 SXM5 ("NVIDIA H100 80GB HBM3")
      {{"GH200"}, 989.4, 494.7, 66.9},
      {{"A100"}, 312.0, 156.0, 19.5},          // A100, SXM4 and PCIe alike
      {{"V100"}, 125.0, 0.0, 15.7},            // no TF32; its 16-bit peak is float16's
  };
  return table;
}

}  // namespace

double peak_tflops(const std::string& gpu_name, DType type, bool tf32) {
  for (const Peak& p : peaks()) {
    bool all = true;
    for (const std::string& w : p.words) all = all && gpu_name.find(w) != std::string::npos;
    if (!all) continue;
    if (type == DType::bfloat16 || type == DType::float16) return p.sixteen_bit;
    return tf32 ? p.tf32 : p.float32;
  }
  return 0.0;
}

}  // namespace course::metrics
