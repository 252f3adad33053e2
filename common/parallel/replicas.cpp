// Replica checksums and rank-0-only work.
#include "common/parallel/replicas.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "common/checkpoint/checksum.h"  // StreamChecksum: the eight-lane FNV-1a
#include "common/comm/agree.h"  // broadcast_string
#include "common/core/errors.h"

namespace course::parallel {

// The checkpoints' eight-lane checksum: a single chain, a multiply a byte, took a tenth of chapter 05's
// verified run (7.4M parameters, compared at every step).
std::uint64_t parameter_checksum(const std::vector<Tensor>& parameters) {
  checkpoint::StreamChecksum sum(checkpoint::ChecksumKind::lanes);
  for (const auto& p : parameters) {
    const std::vector<float> values = p.to_host();
    sum.add(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
  }
  return sum.value();
}

std::uint64_t parameter_checksum(const std::vector<float>& values) {
  checkpoint::StreamChecksum sum(checkpoint::ChecksumKind::lanes);
  sum.add(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
  return sum.value();
}

std::vector<std::uint64_t> gather_checksums(comm::Communicator& group, std::uint64_t mine) {
  // The 64-bit checksum travels as four 16-bit pieces, each exact in a float.
  std::vector<float> pieces(4);
  for (int i = 0; i < 4; ++i) pieces[static_cast<std::size_t>(i)] = static_cast<float>((mine >> (16 * i)) & 0xFFFF);
  Tensor all = Tensor::zeros({4 * group.size()});
  group.all_gather(Tensor::from_host(pieces, {4}), all);
  const auto values = all.to_host();
  std::vector<std::uint64_t> sums(static_cast<std::size_t>(group.size()), 0);
  for (std::size_t i = 0; i < values.size(); ++i)
    sums[i / 4] |= static_cast<std::uint64_t>(values[i]) << (16 * (i % 4));
  return sums;
}

bool parameters_identical(comm::Communicator& group, const std::vector<Tensor>& parameters) {
  const auto sums = gather_checksums(group, parameter_checksum(parameters));
  return std::all_of(sums.begin(), sums.end(), [&](std::uint64_t s) { return s == sums.front(); });
}

void stray_by_one_rounding(const Tensor& parameter) {
  std::vector<float> values = parameter.to_host();
  values[0] = std::nextafter(values[0], INFINITY);
  Tensor(parameter).copy_from(Tensor::from_host(values, parameter.shape(), parameter.device()));
}

void stray_state_by_one_rounding(const optim::Optimizer& optimizer, const Tensor& parameter) {
  for (const auto& [name, state] : optimizer.state())
    if (optimizer.parameter_of(name).impl() == parameter.impl()) return stray_by_one_rounding(state);
}

void on_rank0(comm::Communicator& group, const std::function<void()>& work) {
  std::string failed;  // "" when it worked, else 'U' (a usage error) or 'E', then the message
  if (group.rank() == 0) {
    try {
      work();
    } catch (const UsageError& e) {
      failed = std::string("U") + e.what();
    } catch (const std::exception& e) {
      failed = std::string("E") + e.what();
    }
  }
  comm::broadcast_string(group, failed, 0);
  if (failed.empty()) return;
  if (failed[0] == 'U') throw UsageError(failed.substr(1));
  throw SharedError(failed.substr(1));
}

}  // namespace course::parallel
