// A training checkpoint: everything a run needs to continue exactly where it stopped. The tensors are
// the model's parameters under their own names ("0.weight", ..., so any framework can load them) and
// the optimizer's state under "optimizer." ("optimizer.0.exp_avg", ...). The metadata (strings, as
// safetensors requires) holds the training state below, the optimizer's step count, and the model's
// configuration with its hash, so a checkpoint is never loaded into another model.
#pragma once
#include <cstdint>
#include <string>

#include "common/checkpoint/safetensors.h"
#include "common/nn/module.h"
#include "common/optim/grad_scaler.h"
#include "common/optim/optimizer.h"

namespace course::checkpoint {

struct TrainingState {
  std::int64_t step = 0;          // optimizer steps completed
  std::int64_t samples_seen = 0;  // the global sample position (data::SampleStream): valid at any world size
  std::int64_t epoch = 0;         // samples_seen / dataset size, for people reading the file
  std::uint64_t seed = 0;         // the sample order's generator is counter-based: (seed, epoch) is its whole state
  std::int64_t global_batch = 0;
  int world_size = 1;         // at save time
  std::string world_history;  // each world size and the step it started at: "4@0 2@40"
  optim::GradScalerState loss_scale;  // fp16's dynamic loss scale, which decides whether the next steps skip
};

// What a checkpoint records of the model: its configuration as JSON text, and a hash of it.
std::string config_hash(const std::string& model_config);

NamedTensors training_tensors(const nn::Module& model, const optim::Optimizer& optimizer);
// The metadata of `state`, with the digest of the training state in memory ("state_digest", below).
Metadata training_metadata(const TrainingState& state, const std::string& model_config, const nn::Module& model,
                           const optim::Optimizer& optimizer);

// A checkpoint's checksum covers the bytes written, so a writer that puts wrong values into a file (Adam's
// moments zeroed, a tensor under another's name) writes a file whose checksum matches. So a checkpoint
// also carries the digest of the training state computed from the values themselves: FNV-1a over every
// tensor's name and its values' bits, in the order of the names, and over every metadata entry but the
// digest and the checksum (the step, the sample position, the optimizer's step count, the loss scale,
// the configuration, ...). training_metadata() takes it from the tensors in memory, before anything is
// serialised; check_training_checkpoint() requires the tensors read (at save, those about to be written)
// to give it again, and restore() requires the run's own tensors to, once restored. 16 hexadecimal digits.
std::string state_digest(const NamedTensors& tensors, const Metadata& metadata);

// fp16's loss scale in a checkpoint's metadata (nothing for a disabled scaler: scale 0): the scale
// exactly, in hexadecimal, its growth count and the steps it skipped; loss_scale_of reads it back (a
// zero state when absent) and throws CheckpointError naming `path` when it is malformed.
void put_loss_scale(Metadata& m, const optim::GradScalerState& state);
optim::GradScalerState loss_scale_of(const std::string& path, const Metadata& m);

// Checks a loaded checkpoint against this run: the training metadata is complete and well-formed,
// the model configuration's hash matches, and every parameter and optimizer tensor is present with
// this model's shape. Returns the training state, or throws CheckpointError naming `path` and the
// first problem.
TrainingState check_training_checkpoint(const std::string& path, const Loaded& loaded, const nn::Module& model,
                                        const std::string& model_config, const optim::Optimizer& optimizer);

// Copies a checked checkpoint's parameters and optimizer state (and step count) into the run, and throws
// CheckpointError naming `path` when the run's state then does not give the checkpoint's digest.
void restore(const std::string& path, const Loaded& loaded, nn::Module& model, optim::Optimizer& optimizer);

}  // namespace course::checkpoint
