// Pipeline parallelism under mpirun with 1, 2 and 4 ranks (the whole world is one pipeline): the GPT cut
// into stages, run by the GPipe and the 1F1B schedule with 1 to 8 micro-batches, gives the whole
// model's loss, and every stage's gradients are the whole model's gradients of its layers (the tied
// table's included, on the first and the last stage), also when each stage's blocks are tensor-parallel
// (TP 2 x PP 2 at 4 ranks), with or without sequence parallelism, and with replicas averaging through
// DDP. 1F1B holds fewer activations than GPipe. The grid's parts put back together are the whole model.
// Zero bubble's split backward gives 1F1B's gradients bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>

#include "common/nn/gpt.h"
#include "common/ops/autocast.h"
#include "common/ops/ops.h"
#include "common/parallel/pipeline.h"
#include "common/parallel/tensor_parallel_gpt.h"
#include "common/verify/whole_model.h"
#include "common/verify/compare.h"
#include "support/mpi_main.h"

namespace course::testing {
namespace {

// Micro-batching sums each weight's gradient over the micro-batches one after the other, where the
// whole batch sums it inside one GEMM: the same terms in another order, a few float32 roundings of
// gradients below 1 apart. A missing micro-batch or a lost tied gradient is off by whole terms.
constexpr double kReorderTolerance = 2e-6;

nn::GPTConfig small_gpt() {
  nn::GPTConfig c;
  c.n_layer = 4, c.n_head = 2, c.n_embd = 16, c.block_size = 8, c.vocab_size = 11;
  return c;
}

constexpr std::int64_t kBatch = 8, kT = 8;

std::pair<Tensor, Tensor> batch() {
  std::vector<float> ids(kBatch * kT), targets(kBatch * kT);
  for (std::size_t i = 0; i < ids.size(); ++i) {
    ids[i] = static_cast<float>((i * 7 + 3) % 11);
    targets[i] = i % 6 == 0 ? -100.0f : static_cast<float>((i * 5 + 1) % 11);
  }
  return {Tensor::from_host(ids, {kBatch, kT}), Tensor::from_host(targets, {kBatch * kT})};
}

// The batch cut into m micro-batches of whole sequences: their ids and their targets.
std::pair<std::vector<Tensor>, std::vector<Tensor>> micro_batches(const Tensor& ids, const Tensor& targets, int m) {
  std::vector<Tensor> micro_ids, micro_targets;
  const std::int64_t rows = kBatch / m;
  for (int i = 0; i < m; ++i) {
    micro_ids.push_back(narrow(ids, i * rows, rows));
    micro_targets.push_back(narrow(targets, i * rows * kT, rows * kT));
  }
  return {micro_ids, micro_targets};
}

// The world as TP x PP, TP fastest (as the topology lays it out): this rank's TP group and pipeline.
std::pair<std::unique_ptr<comm::Communicator>, std::unique_ptr<comm::Communicator>> tp_by_pp(int tp_size) {
  return {world().split(world().rank() / tp_size, world().rank()), world().split(world().rank() % tp_size, world().rank())};
}

TEST(Pipeline, EveryScheduleAndMicroBatchCountGivesTheWholeModelsGradients) {
  comm::Communicator& pp = world();
  const auto [ids, targets] = batch();
  nn::GPT full(small_gpt(), Device::cpu, 5);
  Tensor expected = cross_entropy(full(ids), targets);
  expected.backward();
  std::map<std::string, std::vector<float>> whole;
  for (const auto& [name, p] : full.named_parameters()) whole[name] = p.grad().to_host();

  for (const std::string name : {"gpipe", "1f1b"})
    for (int m : {1, 2, 4, 8}) {
      SCOPED_TRACE(name + " with " + std::to_string(m) + " micro-batches on " + std::to_string(pp.size()) + " stages");
      parallel::PipelineStageGPT stage(full, pp);
      const auto [micro_ids, micro_targets] = micro_batches(ids, targets, m);
      const auto step = parallel::run_pipeline(stage, parallel::PipelineLinks::along(pp),
          parallel::make_schedule(name, pp.size(), m), micro_ids,
                                               micro_targets);
      parallel::finish_gradients(stage);
      EXPECT_NEAR(step.loss, expected.item(), kReorderTolerance);
      EXPECT_EQ(step.timeline.size(), static_cast<std::size_t>(2 * m));
      std::size_t checked = 0;
      for (const auto& [param, p] : stage.named_parameters()) {
        ASSERT_TRUE(whole.count(param)) << param;
        EXPECT_LE(verify::max_abs_diff(p.grad().to_host(), whole[param]), kReorderTolerance) << param;
        ++checked;
      }
      // Every stage holds its share of the blocks, the first the tables, the last the final norm and
      // the head (the table again).
      const std::size_t per_block = full.blocks().front()->named_parameters().size();
      EXPECT_EQ(checked, per_block * static_cast<std::size_t>(4 / pp.size()) + (stage.is_first() ? 2 : 0) +
                             (stage.is_last() ? 2 + (stage.is_first() ? 0 : 1) : 0));
    }
}

// Interleaved 1F1B (Narayanan et al. 2021): with v = 2 chunks per rank each rank holds two pieces of the
// 8-layer GPT (rank r pieces r and r + p), and a micro-batch passes every rank twice. Each parameter's
// gradient sums the same micro-batches in the same order as under 1F1B with one stage per rank, so the
// two agree bit for bit, with and without tensor-parallel blocks (TP 2 x PP 2 at 4 ranks), and both are
// the whole model's.
TEST(Pipeline, InterleavedChunksGiveThe1F1BGradientsBitForBit) {
  for (const int tp_size : {1, 2}) {
    if (world().size() % tp_size != 0 || (tp_size > 1 && world().size() < 4)) continue;
    const int pp_size = world().size() / tp_size;
    auto [tp, pp] = tp_by_pp(tp_size);
    nn::GPTConfig config = small_gpt();
    config.n_layer = 8, config.vocab_size = 12;
    nn::GPT full(config, Device::cpu, 5);
    const auto [ids, targets] = batch();
    Tensor expected = cross_entropy(full(ids), targets);
    expected.backward();
    std::map<std::string, Tensor> whole;
    for (const auto& [name, p] : full.named_parameters()) whole[name] = p.grad();
    for (int m : {pp_size, 2 * pp_size}) {
      if (kBatch % m != 0) continue;
      SCOPED_TRACE("TP " + std::to_string(tp_size) + " x PP " + std::to_string(pp_size) + ", " + std::to_string(m) +
                   " micro-batches");
      const auto [micro_ids, micro_targets] = micro_batches(ids, targets, m);
      std::vector<float> one_chunk;  // 1F1B's gradients of the whole model, gathered on rank 0
      for (const int chunks : {1, 2}) {
        parallel::PipelineStageGPT stage(full, *pp, tp.get(), false, chunks);
        const auto step = parallel::run_pipeline(stage, parallel::PipelineLinks::along(*pp),
                                                 parallel::make_schedule(chunks == 1 ? "1f1b" : "interleaved", pp_size, m, chunks),
                                                 micro_ids, micro_targets);
        parallel::finish_gradients(stage);
        EXPECT_NEAR(step.loss, expected.item(), kReorderTolerance);
        EXPECT_EQ(step.timeline.size(), static_cast<std::size_t>(2 * m * chunks));
        for (const auto& [name, p] : stage.named_parameters()) {
          const Tensor part = stage.part_of(name, whole[name]);
          EXPECT_LE(verify::max_abs_diff(p.grad().to_host(), part.to_host()), kReorderTolerance) << name;
        }
        // The ranks hold other layers with two chunks than with one: compare the whole model's, gathered.
        verify::WholeModelGather gather(stage, full, world(), [&](const std::string& name) {
          const bool tied_copy = name == "transformer.wte.weight" && stage.is_last() && !stage.is_first();
          return (stage.is_split(name) || tp->rank() == 0) && !tied_copy;
        });
        const auto gradients = gather.gradients();
        if (chunks == 1) {
          one_chunk = gradients;
        } else if (world().rank() == 0) {
          ASSERT_EQ(gradients.size(), one_chunk.size());
          EXPECT_EQ(std::memcmp(gradients.data(), one_chunk.data(), gradients.size() * sizeof(float)), 0);
        }
      }
    }
  }
}

// Zero bubble's split backward (B now, W where the schedule puts it) gives 1F1B's gradients of every
// stage bit for bit: the same rules on the same values, each weight's micro-batches added in order.
// Also with tensor-parallel stages (TP 2 x PP 2 at 4 ranks), and under bfloat16 autocast.
TEST(Pipeline, ZeroBubbleGivesThe1F1BGradientsBitForBit) {
  for (const int tp_size : {1, 2}) {
    if (world().size() % tp_size != 0 || (tp_size > 1 && world().size() < 4)) continue;
    const int pp_size = world().size() / tp_size;
    auto [tp, pp] = tp_by_pp(tp_size);
    nn::GPTConfig config = small_gpt();
    config.vocab_size = 12;
    nn::GPT full(config, Device::cpu, 5);
    const auto [ids, targets] = batch();
    for (const DType precision : {DType::float32, DType::bfloat16})
      for (int m : {1, 2, 4, 8}) {
        SCOPED_TRACE("TP " + std::to_string(tp_size) + " x PP " + std::to_string(pp_size) + ", " + std::to_string(m) +
                     " micro-batches, " + dtype_name(precision));
        const auto [micro_ids, micro_targets] = micro_batches(ids, targets, m);
        std::map<std::string, std::vector<float>> one_f_one_b;
        for (const std::string schedule : {"1f1b", "zero-bubble"}) {
          parallel::PipelineStageGPT stage(full, *pp, tp.get());
          Autocast autocast(precision, precision != DType::float32);
          const auto step = parallel::run_pipeline(stage, parallel::PipelineLinks::along(*pp),
                                                   parallel::make_schedule(schedule, pp_size, m), micro_ids, micro_targets);
          parallel::finish_gradients(stage);
          EXPECT_EQ(step.timeline.size(), static_cast<std::size_t>((schedule == "1f1b" ? 2 : 3) * m));
          for (const auto& [name, p] : stage.named_parameters()) {
            ASSERT_TRUE(p.grad().defined()) << name;
            const auto g = p.grad().to_host();
            if (schedule == "1f1b") {
              one_f_one_b[name] = g;
            } else {
              ASSERT_EQ(g.size(), one_f_one_b[name].size()) << name;
              EXPECT_EQ(std::memcmp(g.data(), one_f_one_b[name].data(), g.size() * sizeof(float)), 0) << name;
            }
          }
        }
      }
  }
}

// TP x PP: at 4 ranks two stages of two tensor-parallel ranks each (consecutive ranks share a stage,
// as the topology lays TP out fastest); at fewer, what divides.
TEST(Pipeline, StagesOfTensorParallelBlocksGiveTheWholeModelsGradients) {
  const int tp_size = world().size() >= 4 ? 2 : 1, pp_size = world().size() / tp_size;
  auto [tp, pp] = tp_by_pp(tp_size);  // the same stage; the same TP coordinate, by stage
  const auto [ids, targets] = batch();
  nn::GPTConfig config = small_gpt();
  config.vocab_size = 12;  // divides among the TP ranks
  nn::GPT full(config, Device::cpu, 5);
  const Tensor& target_tensor = targets;  // tokens 0-10: valid in the larger vocabulary too
  Tensor expected = cross_entropy(full(ids), target_tensor);
  expected.backward();
  std::map<std::string, Tensor> whole;
  for (const auto& [name, p] : full.named_parameters()) whole[name] = p.grad();

  std::vector<Tensor> micro_ids, micro_targets;
  for (int i = 0; i < 4; ++i) {
    micro_ids.push_back(narrow(ids, i * 2, 2));
    micro_targets.push_back(narrow(target_tensor, i * 2 * kT, 2 * kT));
  }
  // Without, then with sequence parallelism: the stages then pass each other shards of the sequence.
  for (const bool sequence_parallel : {false, true}) {
    SCOPED_TRACE(sequence_parallel ? "sequence parallel" : "tensor parallel");
    parallel::PipelineStageGPT stage(full, *pp, tp.get(), sequence_parallel);
    const auto step = parallel::run_pipeline(stage, parallel::PipelineLinks::along(*pp),
        parallel::make_schedule("1f1b", pp_size, 4), micro_ids,
                                             micro_targets);
    parallel::finish_gradients(stage);
    EXPECT_NEAR(step.loss, expected.item(), kReorderTolerance);
    for (const auto& [name, p] : stage.named_parameters()) {
      ASSERT_TRUE(whole.count(name)) << name;
      const Tensor part = stage.part_of(name, whole[name]);
      EXPECT_EQ(p.shape(), part.shape()) << name;
      EXPECT_LE(verify::max_abs_diff(p.grad().to_host(), part.to_host()), kReorderTolerance) << name;
    }
  }
}

// The parts of TP x PP put back together (each element from the one rank responsible for it: TP rank 0
// for what every TP rank holds whole, the first stage for the tied table) are the whole model's
// parameters bit for bit, and after a step its gradients.
TEST(Pipeline, TheGridsPartsAssembleIntoTheWholeModel) {
  const int tp_size = world().size() >= 4 ? 2 : 1, pp_size = world().size() / tp_size;
  auto [tp, pp] = tp_by_pp(tp_size);
  nn::GPTConfig config = small_gpt();
  config.vocab_size = 12;
  nn::GPT full(config, Device::cpu, 5);
  const auto [ids, targets] = batch();
  Tensor expected = cross_entropy(full(ids), targets);
  expected.backward();
  parallel::PipelineStageGPT stage(full, *pp, tp.get());
  auto responsible = [&](const std::string& name) {
    const bool tied_copy = name == "transformer.wte.weight" && stage.is_last() && !stage.is_first();
    return (stage.is_split(name) || tp->rank() == 0) && !tied_copy;
  };
  for (const auto& [name, p] : stage.named_parameters())  // the model's own rule is the one written here
    EXPECT_EQ(stage.counts_once(name), responsible(name)) << name << " on stage " << pp->rank() << ", TP rank " << tp->rank();
  verify::WholeModelGather gather(stage, full, world(), responsible);
  const auto parameters = gather.parameters();
  if (world().rank() == 0) {
    EXPECT_EQ(parameters, full.parameters_to_host());
  } else {
    EXPECT_TRUE(parameters.empty());
  }
  std::vector<Tensor> micro_ids{ids}, micro_targets{targets};
  parallel::run_pipeline(stage, parallel::PipelineLinks::along(*pp),
      parallel::make_schedule("1f1b", pp_size, 1), micro_ids, micro_targets);
  parallel::finish_gradients(stage);
  const auto gradients = gather.gradients();
  if (world().rank() == 0) {
    EXPECT_LE(verify::max_abs_diff(gradients, full.gradients_to_host()), kReorderTolerance);
  }
  // A rule that takes a copy twice (every TP rank's copy of a layer norm) is off by whole values.
  if (tp_size > 1) {
    verify::WholeModelGather twice(stage, full, world(), [&](const std::string& name) {
      return name.find("wte") == std::string::npos || stage.is_first();
    });
    const auto doubled = twice.parameters();
    if (world().rank() == 0) {
      EXPECT_GT(verify::max_abs_diff(doubled, full.parameters_to_host()), 0.01);
    }
  }
}

// Data parallelism on top: each stage wrapped in DistributedDataParallel on its DP group, two
// replicas each taking half the batch in two micro-batches. Every backward but the stage's last runs
// under no_sync, so the replicas average once per step, and the gradients are the whole batch's.
TEST(Pipeline, ReplicasOfThePipelineAverageOnceThroughDdp) {
  const int dp_size = world().size() >= 2 ? 2 : 1, pp_size = world().size() / dp_size;
  auto pp = world().split(world().rank() / pp_size, world().rank());  // one replica's stages
  auto dp = world().split(world().rank() % pp_size, world().rank());  // the same stage in every replica
  auto [ids, targets] = batch();
  // Every target counts, so that each replica's mean weighs alike in the average.
  auto counted = targets.to_host();
  for (float& t : counted) t = t < 0 ? 0.0f : t;
  targets = Tensor::from_host(counted, targets.shape());
  nn::GPT full(small_gpt(), Device::cpu, 5);
  Tensor expected = cross_entropy(full(ids), targets);
  expected.backward();
  std::map<std::string, std::vector<float>> whole;
  for (const auto& [name, p] : full.named_parameters()) whole[name] = p.grad().to_host();

  auto stage = std::make_shared<parallel::PipelineStageGPT>(full, *pp);
  parallel::DistributedDataParallel ddp(stage, *dp);
  const std::int64_t share = kBatch / dp_size, rows = share / 2;
  std::vector<Tensor> micro_ids, micro_targets;
  for (int i = 0; i < 2; ++i) {
    const std::int64_t first = dp->rank() * share + i * rows;
    micro_ids.push_back(narrow(ids, first, rows));
    micro_targets.push_back(narrow(targets, first * kT, rows * kT));
  }
  parallel::run_pipeline(*stage, parallel::PipelineLinks::along(*pp),
      parallel::make_schedule("1f1b", pp_size, 2), micro_ids, micro_targets, -100, {&ddp});
  parallel::finish_gradients(*stage);
  EXPECT_EQ(ddp.synchronisations(), 1);
  for (const auto& [name, p] : stage->named_parameters())
    EXPECT_LE(verify::max_abs_diff(p.grad().to_host(), whole[name]), kReorderTolerance) << name;
}

TEST(Pipeline, OneFOneBHoldsFewerActivationsThanGPipe) {
  comm::Communicator& pp = world();
  const auto [ids, targets] = batch();
  nn::GPT full(small_gpt(), Device::cpu, 5);
  std::map<std::string, std::int64_t> peak;
  for (const std::string name : {"gpipe", "1f1b"}) {
    parallel::PipelineStageGPT stage(full, pp);
    std::vector<Tensor> micro_ids, micro_targets;
    for (int i = 0; i < 8; ++i) {
      micro_ids.push_back(narrow(ids, i, 1));
      micro_targets.push_back(narrow(targets, i * kT, kT));
    }
    peak[name] = parallel::run_pipeline(stage, parallel::PipelineLinks::along(pp),
        parallel::make_schedule(name, pp.size(), 8), micro_ids, micro_targets)
                     .peak_activation_bytes;
  }
  // GPipe keeps all 8 micro-batches' activations; 1F1B at most p - s of them.
  if (pp.size() - pp.rank() < 8) {
    EXPECT_LT(peak["1f1b"], peak["gpipe"]) << "stage " << pp.rank();
  }
  EXPECT_GT(peak["1f1b"], 0);
}

TEST(Pipeline, LayersThatDoNotDivideAreNamed) {
  nn::GPTConfig c = small_gpt();
  c.n_layer = 3;
  nn::GPT full(c, Device::cpu, 5);
  if (world().size() == 1) {  // 3 layers on 1 stage
    EXPECT_NO_THROW(parallel::PipelineStageGPT(full, world()));
    return;
  }
  try {
    parallel::PipelineStageGPT stage(full, world());
    FAIL() << "3 layers on " << world().size() << " stages";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("--n-layer: 3 layers do not divide among"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace course::testing

COURSE_MPI_TEST_MAIN()
