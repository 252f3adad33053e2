// Data generation and batching.
#include "common/data/house_prices.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "common/tensor/random.h"

namespace course::data {
namespace {
// Streams of the counter-based generator, so features, noise and weights never share numbers.
constexpr std::uint64_t kFeatureStream = 1, kNoiseStream = 2, kWeightStream = 3;
std::uint64_t stream(std::uint64_t seed, std::uint64_t which) { return random_bits(seed, which); }
}  // namespace

Dataset make_house_prices(std::int64_t size, std::uint64_t seed, float noise) {
  if (size < 1) throw std::invalid_argument("dataset size must be at least 1");
  Dataset d;
  d.size = size;
  d.features = 2;
  d.true_weights = {kTrueBedroomWeight, kTrueBathroomWeight};
  d.true_bias = kTrueBias;
  auto features = stream(seed, kFeatureStream), noises = stream(seed, kNoiseStream);
  for (std::int64_t i = 0; i < size; ++i) {
    auto u = static_cast<std::uint64_t>(i);
    float bedrooms = 1.0f + static_cast<float>(static_cast<int>(random_uniform(features, 2 * u) * 5.0));
    float bathrooms = 1.0f + static_cast<float>(static_cast<int>(random_uniform(features, 2 * u + 1) * 3.0));
    d.x.push_back(bedrooms);
    d.x.push_back(bathrooms);
    d.y.push_back(kTrueBedroomWeight * bedrooms + kTrueBathroomWeight * bathrooms + kTrueBias +
                  noise * static_cast<float>(random_normal(noises, u)));
  }
  return d;
}

Dataset make_house_prices_wide(std::int64_t size, std::int64_t features, std::uint64_t seed, float noise) {
  if (size < 1) throw std::invalid_argument("dataset size must be at least 1");
  if (features < 2) throw std::invalid_argument("the wide dataset needs at least 2 features");
  Dataset d;
  d.size = size;
  d.features = features;
  auto weights = stream(seed, kWeightStream), inputs = stream(seed, kFeatureStream), noises = stream(seed, kNoiseStream);
  for (std::int64_t j = 0; j < features; ++j)
    d.true_weights.push_back(static_cast<float>(random_normal(weights, static_cast<std::uint64_t>(j))));
  d.true_bias = 1.0f;
  d.x.resize(static_cast<std::size_t>(size * features));
  for (std::int64_t i = 0; i < size; ++i) {
    float* row = &d.x[static_cast<std::size_t>(i * features)];
    double price = d.true_bias;
    for (std::int64_t j = 0; j < features; ++j) {
      row[j] = static_cast<float>(random_normal(inputs, static_cast<std::uint64_t>(i * features + j)));
      price += static_cast<double>(d.true_weights[static_cast<std::size_t>(j)]) * row[j];
    }
    price += 0.5 * row[0] * row[1] + noise * random_normal(noises, static_cast<std::uint64_t>(i));
    d.y.push_back(static_cast<float>(price));
  }
  return d;
}

Batch make_batch(const Dataset& d, const std::vector<std::int64_t>& indices, Device device) {
  auto b = static_cast<std::int64_t>(indices.size());
  std::vector<float> x(static_cast<std::size_t>(b * d.features)), y(static_cast<std::size_t>(b));
  for (std::int64_t r = 0; r < b; ++r) {
    std::int64_t i = indices[static_cast<std::size_t>(r)];
    if (i < 0 || i >= d.size) throw std::out_of_range("sample index " + std::to_string(i) + " outside the dataset");
    for (std::int64_t j = 0; j < d.features; ++j)
      x[static_cast<std::size_t>(r * d.features + j)] = d.x[static_cast<std::size_t>(i * d.features + j)];
    y[static_cast<std::size_t>(r)] = d.y[static_cast<std::size_t>(i)];
  }
  return {Tensor::from_host(x, {b, d.features}, device), Tensor::from_host(y, {b, 1}, device)};
}

}  // namespace course::data
