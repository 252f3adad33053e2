// The CUDA kernels that share a formula with the CPU kernels compute it in the same roundings: their PTX
// (nvcc's output for the GPU, made here at build time, no GPU needed) holds no fused multiply-add and no
// float operation that ptxas could still fuse, only explicitly rounded ones (common/kernels/rounded.h).
// On a GPU, kernel_parity_test then finds the same bits; here, this test is how a plain `a * b + c`
// written into a shared formula fails in CI.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

namespace course::testing {
namespace {

#ifdef COURSE_KERNELS_PTX
// The kernel's own name in a mangled one: _ZN, then <length><name> for each enclosing scope (course, the
// anonymous namespace) and the function itself.
std::string kernel_name(const std::string& mangled) {
  std::size_t at = 3;  // after _ZN
  while (at < mangled.size() && std::isdigit(static_cast<unsigned char>(mangled[at]))) {
    std::size_t length = 0;
    while (at < mangled.size() && std::isdigit(static_cast<unsigned char>(mangled[at])))
      length = length * 10 + static_cast<std::size_t>(mangled[at++] - '0');
    const std::string part = mangled.substr(at, length);
    if (part.size() > 7 && part.compare(part.size() - 7, 7, "_kernel") == 0) return part;
    at += length;
  }
  return mangled;
}

// Each kernel's body, by the kernel's name (a template's instances together), from every PTX file
// (COURSE_KERNELS_PTX lists them, separated by ':', as PATH does).
std::map<std::string, std::string> kernel_bodies() {
  std::string ptx;
  std::stringstream files(COURSE_KERNELS_PTX);
  for (std::string file; std::getline(files, file, ':');) {
    std::ifstream in(file);
    EXPECT_TRUE(in.good()) << "cannot read " << file;
    std::stringstream text;
    text << in.rdbuf();
    ptx += text.str();
  }
  std::map<std::string, std::string> bodies;
  const std::regex entry(R"(\.entry\s+(_ZN\w+))");
  std::vector<std::pair<std::size_t, std::string>> starts;
  for (auto it = std::sregex_iterator(ptx.begin(), ptx.end(), entry); it != std::sregex_iterator(); ++it)
    starts.emplace_back(static_cast<std::size_t>(it->position()), kernel_name((*it)[1].str()));
  for (std::size_t i = 0; i < starts.size(); ++i) {
    const std::size_t end = i + 1 < starts.size() ? starts[i + 1].first : ptx.size();
    bodies[starts[i].second] += ptx.substr(starts[i].first, end - starts[i].first);
  }
  return bodies;
}

// The float instructions a compiler may fuse or approximate: fma and mad, a mul, add or sub without a
// rounding modifier (ptxas may contract those), and the approximate division, square root and
// reciprocal. An explicitly rounded one (mul.rn.f32, div.rn.f64, sqrt.rn.f32) is never fused. One
// exception: a product by a power of two (nvcc writes a division by 2, 4, 8, ... so) is exact, and a
// fused add of an exact product rounds as the add alone would.
bool power_of_two_immediate(const std::string& operand) {
  static const std::regex f32(R"(0f[0-9A-Fa-f]{8})"), f64(R"(0d[0-9A-Fa-f]{16})");
  if (std::regex_match(operand, f32)) return (std::stoul(operand.substr(2), nullptr, 16) & 0x7FFFFFu) == 0;
  if (std::regex_match(operand, f64)) return (std::stoull(operand.substr(2), nullptr, 16) & 0xFFFFFFFFFFFFFull) == 0;
  return false;
}

std::vector<std::string> contractible(const std::string& body) {
  static const std::regex fused(
      R"(^\s*(?:@!?%p\d+\s+)?((?:fma|mad)\.[a-z.]*f(?:32|64)|(?:mul|add|sub)(?:\.ftz)?(?:\.sat)?\.f(?:32|64)|(?:div|sqrt|rcp|ex2|lg2)\.(?:approx|full)[a-z.]*f32)\s+([^;]*);)");
  std::vector<std::string> found;
  std::istringstream lines(body);
  for (std::string line; std::getline(lines, line);) {
    std::smatch m;
    if (!std::regex_search(line, m, fused)) continue;
    const std::string operands = m[2].str(), last = operands.substr(operands.rfind(',') + 1);
    if (m[1].str().rfind("mul.", 0) == 0 && power_of_two_immediate(last.substr(last.find_first_not_of(' '))))
      continue;
    found.push_back(m[1].str() + " " + operands);
  }
  return found;
}

// The kernels whose formulas the CPU computes too (math.h, rows.h, half.h, flash.h): element-wise ones,
// layer norm's and the cross-entropy's rows (in lanes), layer norm's columns and the two stages of column
// sums (their sums in the same order on both), the optimizers, and FlashAttention's tiles.
const std::vector<std::string> kSharedFormulaKernels = {
    "to_half_kernel",  "from_half_kernel", "binary_kernel", "binary_half_kernel", "unary_half_kernel",
    "unary_backward_half_kernel", "add_half_kernel",   "binary_broadcast_kernel", "scale_kernel",
    "scale_by_kernel", "unary_kernel",     "unary_backward_kernel", "layer_norm_kernel",
    "layer_norm_backward_x_kernel", "layer_norm_params_chunks_kernel", "cross_entropy_kernel",
    "cross_entropy_backward_kernel", "cross_entropy_half_kernel", "cross_entropy_backward_half_kernel",
    "attention_softmax_kernel", "attention_softmax_backward_kernel", "sum_rows_chunks_kernel",
    "column_totals_kernel", "sgd_kernel", "adam_kernel",
    "dropout_kernel",  "arange_kernel",    "squares_kernel",  "squares_total_kernel", "clip_coefficient_kernel",
    "inverse_count_kernel", "flash_forward_kernel", "flash_delta_kernel", "flash_grad_kv_kernel",
    "flash_grad_q_kernel", "embedding_runs_kernel"};

TEST(RoundedPtx, SharedFormulaKernelsHoldNoContractibleOperation) {
  const auto bodies = kernel_bodies();
  for (const std::string& kernel : kSharedFormulaKernels) {
    const auto it = bodies.find(kernel);
    ASSERT_NE(it, bodies.end()) << kernel << " is not in " << COURSE_KERNELS_PTX;
    const auto found = contractible(it->second);
    EXPECT_TRUE(found.empty()) << kernel << " holds " << found.size() << " contractible operations, the first "
                               << (found.empty() ? "" : found.front());
  }
}

// The scan can fail: ring attention's block kernel takes each score as a dot product, which nvcc fuses
// into FMAs (allowed there: the CPU takes the scores from a GEMM, in another order, and the parity test
// keeps a tolerance for it).
TEST(RoundedPtx, TheScanFindsTheFusedDotProductsOfRingAttention) {
  const auto bodies = kernel_bodies();
  const auto it = bodies.find("attention_block_kernel");
  ASSERT_NE(it, bodies.end());
  const auto found = contractible(it->second);
  EXPECT_TRUE(std::any_of(found.begin(), found.end(), [](const std::string& op) { return op.rfind("fma", 0) == 0; }))
      << found.size() << " contractible operations, none of them an fma";
}
#else
TEST(RoundedPtx, SharedFormulaKernelsHoldNoContractibleOperation) {
  GTEST_SKIP() << "this build has no CUDA backend: there is no PTX to read";
}
#endif

}  // namespace
}  // namespace course::testing
