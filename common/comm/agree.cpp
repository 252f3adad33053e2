// One number, every rank's figures, one string and one failure, agreed over a group.
#include "common/comm/agree.h"

#include <cstdint>
#include <cstring>
#include <vector>

namespace course::comm {

float all_reduce_scalar(Communicator& group, float value, ReduceOp op) {
  Tensor t = Tensor::from_host({value}, {1});
  group.all_reduce(t, op);
  return t.item();
}

std::vector<std::vector<double>> all_gather_values(Communicator& group, const std::vector<double>& values) {
  const std::size_t slots = 2 * values.size();
  std::vector<float> mine(slots);
  if (!values.empty()) std::memcpy(mine.data(), values.data(), values.size() * sizeof(double));
  std::vector<std::vector<double>> all(static_cast<std::size_t>(group.size()), std::vector<double>(values.size()));
  if (values.empty()) return all;
  const Tensor input = Tensor::from_host(mine, {static_cast<std::int64_t>(slots)});
  Tensor output = Tensor::empty({static_cast<std::int64_t>(slots) * group.size()});
  group.all_gather(input, output);
  const auto gathered = output.to_host();
  for (std::size_t r = 0; r < all.size(); ++r)
    std::memcpy(all[r].data(), gathered.data() + r * slots, values.size() * sizeof(double));
  return all;
}

void broadcast_string(Communicator& group, std::string& text, int root) {
  // The length first (64 bits in two float slots), then the bytes, four to a float. Broadcasts copy
  // bits and never compute with them, so any pattern (even a NaN's) arrives unchanged.
  std::vector<float> length(2, 0.0f);
  const std::uint64_t n = text.size();
  std::memcpy(length.data(), &n, sizeof n);
  Tensor length_tensor = Tensor::from_host(length, {2});
  group.broadcast(length_tensor, root);
  std::uint64_t received = 0;
  const auto length_values = length_tensor.to_host();
  std::memcpy(&received, length_values.data(), sizeof received);
  std::vector<float> packed((received + 3) / 4, 0.0f);
  if (group.rank() == root && received) std::memcpy(packed.data(), text.data(), received);
  if (packed.empty()) {
    text.clear();
    return;
  }
  Tensor bytes = Tensor::from_host(packed, {static_cast<std::int64_t>(packed.size())});
  group.broadcast(bytes, root);
  const auto values = bytes.to_host();
  text.assign(reinterpret_cast<const char*>(values.data()), received);
}

FirstError first_error(Communicator& group, const std::string& my_error) {
  // The lowest failing rank is the maximum of -rank over the failing ranks; the others offer -size,
  // which loses to any of them.
  const float lowest = all_reduce_scalar(group, -static_cast<float>(my_error.empty() ? group.size() : group.rank()),
                                         ReduceOp::max);
  FirstError first;
  const int rank = static_cast<int>(-lowest);
  if (rank == group.size()) return first;
  first.rank = rank;
  first.message = my_error;
  broadcast_string(group, first.message, rank);
  return first;
}

}  // namespace course::comm
