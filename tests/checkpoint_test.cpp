// The checkpoint folder and training checkpoints: --keep keeps the newest, `latest` moves only after
// its file is complete, the search order falls back past a bad pointer, a dead writer's temporary is
// found, and a training checkpoint that does not fit the model is rejected with the reason.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "common/checkpoint/folder.h"
#include "common/checkpoint/parameters.h"
#include "common/checkpoint/training_state.h"
#include "common/nn/layers.h"
#include "support/process.h"

namespace course::testing {
namespace {

namespace fs = std::filesystem;
using checkpoint::CheckpointError;
using checkpoint::CheckpointFolder;

std::string fresh_dir() {
  const std::string dir = temp_path("folder_test");
  fs::remove_all(dir);
  return dir;
}

checkpoint::NamedTensors one_tensor(float value) { return {{"w", Tensor::from_host({value}, {1})}}; }

TEST(CheckpointFolder, KeepsTheNewestAndPointsAtTheLast) {
  const std::string dir = fresh_dir();
  CheckpointFolder folder(dir, 2);
  EXPECT_FALSE(folder.has_checkpoints());  // and the folder need not exist yet
  for (int step : {10, 20, 30}) folder.save(step, one_tensor(static_cast<float>(step)), {});
  EXPECT_TRUE(folder.has_checkpoints());
  EXPECT_FALSE(fs::exists(folder.path_for(10)));
  EXPECT_TRUE(fs::exists(folder.path_for(20)));
  EXPECT_EQ(read_file(folder.latest_pointer()), "step_00000030.safetensors\n");
  EXPECT_EQ(folder.candidates(), (std::vector<std::string>{folder.path_for(30), folder.path_for(20)}));
  EXPECT_EQ(folder.path_for(30), dir + "/step_00000030.safetensors");
  fs::remove_all(dir);
}

TEST(CheckpointFolder, TheSearchFallsBackPastABadPointer) {
  const std::string dir = fresh_dir();
  CheckpointFolder folder(dir, 5);
  for (int step : {1, 2, 3}) folder.save(step, one_tensor(1.0f), {});
  // The pointer names an older file: it goes first, then the rest newest first.
  std::ofstream(folder.latest_pointer()) << "step_00000002.safetensors\n";
  EXPECT_EQ(folder.candidates(),
            (std::vector<std::string>{folder.path_for(2), folder.path_for(3), folder.path_for(1)}));
  for (const std::string bad : {"step_00000009.safetensors\n", "../../etc/passwd\n", ""}) {
    std::ofstream(folder.latest_pointer()) << bad;
    std::vector<std::string> problems;
    EXPECT_EQ(folder.candidates(&problems),
              (std::vector<std::string>{folder.path_for(3), folder.path_for(2), folder.path_for(1)}));
    ASSERT_EQ(problems.size(), 1u) << bad;
    EXPECT_NE(problems[0].find(folder.latest_pointer()), std::string::npos);
  }
  fs::remove_all(dir);
}

TEST(CheckpointFolder, FindsWhatADeadWriterLeft) {
  const std::string dir = fresh_dir();
  CheckpointFolder folder(dir, 3);
  folder.save(1, one_tensor(1.0f), {});
  std::ofstream(dir + "/.step_00000002.safetensors.tmp.4242") << "half";
  std::ofstream(dir + "/notes.txt") << "a user's file";
  EXPECT_EQ(folder.remove_partial_writes(), std::vector<std::string>{".step_00000002.safetensors.tmp.4242"});
  EXPECT_TRUE(fs::exists(dir + "/notes.txt"));  // nothing else is touched
  EXPECT_EQ(folder.candidates(), std::vector<std::string>{folder.path_for(1)});
  fs::remove_all(dir);
}

TEST(CheckpointFolder, StepNames) {
  EXPECT_EQ(CheckpointFolder::step_of("step_00000040.safetensors"), 40);
  EXPECT_EQ(CheckpointFolder::step_of("step_123456789.safetensors"), 123456789);
  for (const char* name : {"step_.safetensors", "step_12a.safetensors", "step_12.bin", "latest", "x_12.safetensors",
                           "step_-1.safetensors", "step_1234567890123456789.safetensors"})
    EXPECT_EQ(CheckpointFolder::step_of(name), -1) << name;
  EXPECT_THROW(CheckpointFolder("x", 0), std::invalid_argument);
}

// A saved training checkpoint of a small MLP with Adam after one step.
struct Saved {
  std::shared_ptr<nn::Sequential> model = nn::make_mlp(3, 4, 1, 1, nn::Activation::relu, Device::cpu, 1);
  optim::Adam adam{model->parameters(), 0.01f};
  std::string config = R"({"model":"mlp","hidden":4})";
  checkpoint::Loaded loaded;
  Saved() {
    for (auto& p : model->parameters()) p.set_grad(Tensor::full(p.shape(), 0.5f));
    adam.step();
    checkpoint::TrainingState s;
    s.step = 1;
    s.samples_seen = 8;
    s.global_batch = 8;
    s.world_size = 2;
    s.world_history = "2@0";
    loaded.tensors = checkpoint::training_tensors(*model, adam);
    loaded.metadata = checkpoint::training_metadata(s, config, *model, adam);
    loaded.checksummed = true;  // as load_safetensors reports a file whose checksum matched
  }
  checkpoint::TrainingState check() const {
    return checkpoint::check_training_checkpoint("f", loaded, *model, config, adam);
  }
};

void expect_rejected(const Saved& saved, const std::string& reason) {
  try {
    saved.check();
    ADD_FAILURE() << "accepted; expected: " << reason;
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find(reason), std::string::npos) << e.what();
  }
}

TEST(TrainingCheckpoint, RoundTripsAndRestores) {
  Saved saved;
  auto state = saved.check();
  EXPECT_EQ(state.step, 1);
  EXPECT_EQ(state.samples_seen, 8);
  EXPECT_EQ(state.world_history, "2@0");
  auto model = nn::make_mlp(3, 4, 1, 1, nn::Activation::relu, Device::cpu, 99);  // other initial weights
  optim::Adam adam(model->parameters(), 0.01f);
  checkpoint::restore("f", saved.loaded, *model, adam);
  EXPECT_EQ(model->parameters_to_host(), saved.model->parameters_to_host());
  EXPECT_EQ(adam.steps_taken(), 1);
  ASSERT_EQ(adam.state().size(), saved.adam.state().size());
  for (std::size_t i = 0; i < adam.state().size(); ++i)
    EXPECT_EQ(adam.state()[i].second.to_host(), saved.adam.state()[i].second.to_host());
}

TEST(TrainingCheckpoint, WhatDoesNotFitIsRejectedWithTheReason) {
  {
    Saved s;
    s.config = R"({"model":"mlp","hidden":8})";
    expect_rejected(s, "was saved by another run: --hidden: 8 differs from the checkpoint's 4");
  }
  {
    Saved s;  // a key one run lacks has its default: fp32 is written as no precision at all
    s.config = R"({"model":"mlp","hidden":4,"precision":"bf16"})";
    expect_rejected(s, "was saved by another run: --precision: bf16 differs from the checkpoint's fp32");
  }
  {
    Saved s;
    s.loaded.metadata.erase("samples_seen");
    expect_rejected(s, "metadata lacks 'samples_seen'");
  }
  {
    Saved s;
    s.loaded.metadata["step"] = "x1";
    expect_rejected(s, "metadata 'step' is 'x1', not a non-negative integer");
  }
  {
    Saved s;
    s.loaded.metadata["optimizer_step"] = "2";
    expect_rejected(s, "optimizer_step 2 and 0 skipped steps do not add up to step 1");
  }
  {
    Saved s;
    s.loaded.metadata["model_config"] = R"({"model":"mlp","hidden":5})";  // the hash no longer matches it
    expect_rejected(s, "model_config does not match its hash");
  }
  {
    Saved s;
    s.loaded.tensors.erase(s.loaded.tensors.begin());
    expect_rejected(s, "lacks tensor '0.weight'");
  }
  {
    Saved s;
    s.loaded.tensors.emplace_back("extra", Tensor::zeros({1}));
    expect_rejected(s, "1 tensors that this model does not have");
  }
  {
    Saved s;
    s.loaded.tensors.back().second = Tensor::zeros({7});
    expect_rejected(s, "has shape [7]");
  }
  {
    Saved s;
    s.loaded.metadata["optimizer"] = "sgd";
    expect_rejected(s, "holds sgd state; this run uses adam");
  }
  {
    Saved s;  // its checksum deleted from the metadata: damaged, not a file to trust without one
    s.loaded.checksummed = false;
    expect_rejected(s, "has no checksum");
  }
}

// The checksum covers the bytes; the digest covers the values. A state written wrong (a moment zeroed, the
// sample position moved) has a good checksum and is rejected by its digest; a restore that does not give
// the checkpoint's digest throws.
TEST(TrainingCheckpoint, ValuesThatDoNotGiveTheStatesDigestAreRejected) {
  {
    Saved s;
    for (auto& [name, t] : s.loaded.tensors)
      if (name.find(".exp_avg_sq") != std::string::npos) t = Tensor::zeros(t.shape());
    expect_rejected(s, "its values do not give the digest of the training state it was saved from");
  }
  {
    Saved s;
    s.loaded.tensors.front().second = s.loaded.tensors.front().second.clone();
    s.loaded.tensors.front().second.data()[0] += 1e-7f;  // one value, one rounding away
    expect_rejected(s, "its values do not give the digest");
  }
  {
    Saved s;
    s.loaded.metadata["samples_seen"] = "16";
    expect_rejected(s, "its values do not give the digest");
  }
  {
    Saved s;
    s.loaded.metadata.erase("state_digest");
    expect_rejected(s, "metadata lacks 'state_digest'");
  }
  {
    Saved s;  // the digest of other values: the restore itself is judged
    s.loaded.metadata["state_digest"] = "0123456789abcdef";
    auto model = nn::make_mlp(3, 4, 1, 1, nn::Activation::relu, Device::cpu, 99);
    optim::Adam adam(model->parameters(), 0.01f);
    try {
      checkpoint::restore("f", s.loaded, *model, adam);
      ADD_FAILURE() << "restored against a digest it does not give";
    } catch (const CheckpointError& e) {
      EXPECT_NE(std::string(e.what()).find("the restore went wrong"), std::string::npos) << e.what();
    }
  }
}

TEST(Parameters, LoadPutsEverySavedValueBackByName) {
  const std::string path = temp_path("params.safetensors");
  auto saved = nn::make_mlp(3, 5, 2, 1, nn::Activation::relu, Device::cpu, 1);
  auto loaded = nn::make_mlp(3, 5, 2, 1, nn::Activation::relu, Device::cpu, 2);
  ASSERT_NE(saved->parameters_to_host(), loaded->parameters_to_host());
  checkpoint::save_parameters(path, *saved);
  checkpoint::load_parameters(path, *loaded);
  EXPECT_EQ(saved->parameters_to_host(), loaded->parameters_to_host());
  // Another width, or another depth, is named and refused; the model is left as it was.
  auto narrower = nn::make_mlp(3, 4, 2, 1, nn::Activation::relu, Device::cpu, 2);
  const auto before = narrower->parameters_to_host();
  try {
    checkpoint::load_parameters(path, *narrower);
    FAIL() << "a model of another width loaded";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("'0.weight' has shape [5, 3]; this model's is [4, 3]"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(narrower->parameters_to_host(), before);
  auto shallower = nn::make_mlp(3, 5, 1, 1, nn::Activation::relu, Device::cpu, 2);
  EXPECT_THROW(checkpoint::load_parameters(path, *shallower), CheckpointError);  // holds 4.weight, which it lacks
  auto deeper = nn::make_mlp(3, 5, 3, 1, nn::Activation::relu, Device::cpu, 2);
  EXPECT_THROW(checkpoint::load_parameters(path, *deeper), CheckpointError);  // has no 6.weight
  std::remove(path.c_str());
}

}  // namespace
}  // namespace course::testing
