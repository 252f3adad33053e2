// The synthetic house-price data the course trains on, with known true weights, seeded, any size.
#pragma once
#include <cstdint>
#include <vector>

#include "common/data/sampling.h"
#include "common/tensor/tensor.h"

namespace course::data {

struct Dataset {
  std::int64_t size = 0;
  std::int64_t features = 0;
  std::vector<float> x;             // row-major [size, features]
  std::vector<float> y;             // [size]
  std::vector<float> true_weights;  // the linear part of the generating rule
  float true_bias = 0.0f;
};

// price = w1 * bedrooms + w2 * bathrooms + b + noise, in units of $10,000;
// bedrooms in 1..5 and bathrooms in 1..3, drawn uniformly.
constexpr float kTrueBedroomWeight = 3.0f;
constexpr float kTrueBathroomWeight = 1.5f;
constexpr float kTrueBias = 2.0f;
Dataset make_house_prices(std::int64_t size, std::uint64_t seed, float noise = 0.1f);

// The wider variant for the MLP: `features` standard-normal inputs, a seeded linear part, and one
// interaction term (0.5 * x0 * x1) that a linear model cannot fit but an MLP can.
Dataset make_house_prices_wide(std::int64_t size, std::int64_t features, std::uint64_t seed, float noise = 0.1f);

struct Batch {
  Tensor x;  // [B, features]
  Tensor y;  // [B, 1]
};
Batch make_batch(const Dataset& dataset, const std::vector<std::int64_t>& indices, Device device);

}  // namespace course::data
