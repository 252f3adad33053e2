// What a training chapter trains, as one object: how to build the model and the loss of any set of
// samples. Chapters run the same data-parallel loop over either task, so `--model mlp|gpt` changes
// only this: the MLP on the wide house-price regression, or the GPT on the addition task.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/data/addition.h"
#include "common/data/house_prices.h"
#include "common/data/text.h"
#include "common/nn/gpt.h"
#include "common/nn/layers.h"

namespace course::nn {

struct TrainingTask {
  std::string name;         // "mlp" or "gpt"
  std::int64_t size = 0;    // samples (or problems) to draw batches from
  std::string description;  // for the log: the model and the data
  // A freshly initialised model; the same seed gives the same weights.
  std::function<std::shared_ptr<Module>(std::uint64_t seed)> make_model;
  // The mean loss of these samples (for the GPT, over their answer tokens).
  std::function<Tensor(Module& model, const std::vector<std::int64_t>& samples)> loss;
  // What the trained model can do on held-out data, where the task can say; empty otherwise.
  struct Evaluation {
    std::string metric;  // "held-out exact match", "validation loss"
    double value = 0;
    std::vector<std::string> examples;  // a few answers ("12+45=57"), or a generated passage
  };
  std::function<Evaluation(Module& model)> evaluate;
};

// The MLP of `layers` hidden layers of `hidden`, on `samples` house prices of `features` features.
TrainingTask mlp_task(std::int64_t samples, std::int64_t features, std::int64_t hidden, int layers, Device device,
                      std::uint64_t seed, Activation activation = Activation::relu);

// A GPT of `config` (vocab_size and block_size are set from the task) on `problems` addition problems of
// `digits` digits, with `test_problems` held out. Throws UsageError for impossible sizes.
struct GptTask {
  TrainingTask task;
  std::shared_ptr<data::AdditionTask> data;
  GPTConfig config;
};
GptTask gpt_task(GPTConfig config, int digits, std::int64_t problems, std::int64_t test_problems, Device device,
                 std::uint64_t seed);

// A GPT of `config` on the character-level text of `path` (--data FILE), the last `val_fraction` held
// out. The vocabulary is the file's; block_size 0 becomes 32. Throws UsageError naming the file.
struct GptTextTask {
  TrainingTask task;
  std::shared_ptr<data::CharText> data;  // training sample i is window i
  GPTConfig config;
};
GptTextTask gpt_text_task(GPTConfig config, const std::string& path, double val_fraction, Device device);

}  // namespace course::nn
