// Learning where each part lies, and assembling the whole.
#include "common/verify/whole_model.h"

#include <map>
#include <stdexcept>

namespace course::verify {
namespace {

// Element indices as float32 are exact only below 2^24, so a whole tensor's indices travel through
// part_of in two halves: i = high x 4096 + low, each exact.
constexpr std::int64_t kHalf = 4096;

}  // namespace

std::vector<std::int64_t> places_in_whole(const TensorParallelModule& part, const std::string& name,
                                          const Shape& whole_shape, Device device) {
  const std::int64_t n = shape_numel(whole_shape);
  std::vector<float> high(static_cast<std::size_t>(n)), low(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) high[static_cast<std::size_t>(i)] = static_cast<float>(i / kHalf),
                                       low[static_cast<std::size_t>(i)] = static_cast<float>(i % kHalf);
  const auto h = part.part_of(name, Tensor::from_host(high, whole_shape, device)).to_host();
  const auto l = part.part_of(name, Tensor::from_host(low, whole_shape, device)).to_host();
  std::vector<std::int64_t> places(h.size());
  for (std::size_t j = 0; j < h.size(); ++j)
    places[j] = static_cast<std::int64_t>(h[j]) * kHalf + static_cast<std::int64_t>(l[j]);
  return places;
}

WholeModelGather::WholeModelGather(const TensorParallelModule& part, const nn::Module& whole, comm::Communicator& world,
                                   const std::function<bool(const std::string&)>& responsible)
    : world_(world), device_(whole.parameters().front().device()) {
  std::map<std::string, std::pair<std::int64_t, Shape>> at;  // name -> (offset in the whole vector, shape)
  for (const auto& [name, p] : whole.named_parameters()) {
    at[name] = {total_, p.shape()};
    total_ += p.numel();
  }
  for (const auto& [name, p] : part.named_parameters()) {
    if (!responsible(name)) continue;
    const auto found = at.find(name);
    if (found == at.end()) throw std::invalid_argument("WholeModelGather: the whole model has no '" + name + "'");
    const auto& [offset, shape] = found->second;
    const auto places = places_in_whole(part, name, shape, device_);
    if (static_cast<std::int64_t>(places.size()) != p.numel())
      throw std::invalid_argument("WholeModelGather: '" + name + "' has " + std::to_string(p.numel()) +
                                  " elements, its part of the whole " + std::to_string(places.size()));
    Piece piece{p, {}};
    for (const std::int64_t place : places) piece.places.push_back(offset + place);
    pieces_.push_back(std::move(piece));
  }
}

std::vector<float> WholeModelGather::assemble(bool gradients) {
  std::vector<float> mine(static_cast<std::size_t>(total_), 0.0f);
  for (const Piece& piece : pieces_) {
    const Tensor source = gradients ? piece.parameter.grad() : piece.parameter;
    if (!source.defined()) continue;
    const auto values = source.to_host();
    for (std::size_t j = 0; j < values.size(); ++j) mine[static_cast<std::size_t>(piece.places[j])] = values[j];
  }
  if (world_.size() == 1) return mine;
  Tensor all = Tensor::from_host(mine, {total_}, device_);
  world_.reduce(all, 0, comm::ReduceOp::sum);
  return world_.rank() == 0 ? all.to_host() : std::vector<float>();
}

}  // namespace course::verify
