// The planner's search (search.h).
#include "common/planner/search.h"

#include <algorithm>

namespace course::planner {

namespace {

std::vector<int> divisors(int n) {
  std::vector<int> out;
  for (int d = 1; d <= n; ++d)
    if (n % d == 0) out.push_back(d);
  return out;
}

// The interleavings to try for stages of `layers_per_stage` layers (none when there are more stages than
// layers: v = 1 then, which predict() refuses with its reason).
std::vector<int> interleavings(const SearchSpace& space, int layers_per_stage) {
  if (!space.virtual_stages.empty()) return space.virtual_stages;
  return layers_per_stage >= 1 ? divisors(layers_per_stage) : std::vector<int>{1};
}

}  // namespace

SearchSpace megatron_2021_space() {
  SearchSpace space;
  space.zero_stages = {0};
  space.recomputations = {Recompute::full};
  space.sequence_parallel = false;
  space.context_parallel = false;
  return space;
}

Prediction predict_fastest(const GptShape& shape, double batch, int tp, int pp, int gpus, const SearchSpace& space) {
  const Cluster cluster = dgx_a100(gpus / 8);
  const Workload w{shape, batch, DType::bfloat16};
  Prediction best;
  bool kept = false;
  for (int micro_batch : space.micro_batches)
    for (int v : interleavings(space, static_cast<int>(shape.layers) / pp)) {
      ParallelConfig config;
      config.tp = tp, config.pp = pp, config.dp = gpus / (tp * pp);
      config.micro_batch = micro_batch, config.virtual_stages = v, config.recompute = Recompute::full;
      const Prediction p = predict(w, cluster, config);
      const bool better = p.rejected.empty() && (!best.rejected.empty() || p.tokens_per_second > best.tokens_per_second);
      if (!kept || better) best = p, kept = true;
    }
  return best;
}

Prediction predict_published(const PublishedRun& run, const SearchSpace& space) {
  return predict_fastest(run.shape, run.batch, run.tp, run.pp, run.gpus, space);
}

SearchResult search(const Workload& w, const Cluster& c, const SearchSpace& space) {
  SearchResult result;
  auto consider = [&](const ParallelConfig& config) {
    Prediction prediction = predict(w, c, config);
    ++result.tried;
    if (prediction.rejected.empty()) {
      result.fitting.push_back(prediction);
      return;
    }
    const std::string kind = prediction.rejected.substr(0, prediction.rejected.find(':'));
    auto& group = result.rejected[kind];
    // The example: for memory, the configuration that came closest; otherwise the first.
    if (group.count++ == 0 || prediction.memory.total() < group.example.memory.total()) group.example = prediction;
  };
  const int gpus = c.gpus();
  // TP: powers of two up to the heads (beyond a node too, to say why not); CP: 1, 2, 4, 8.
  for (int tp = 1; tp <= gpus && tp <= w.shape.heads; tp *= 2) {
    for (int cp = 1; cp <= (space.context_parallel ? 8 : 1) && tp * cp <= gpus; cp *= 2) {
      if ((gpus / tp) % cp != 0) continue;
      for (int pp : divisors(gpus / (tp * cp))) {
        if (pp > w.shape.layers) break;
        const int dp = gpus / (tp * cp * pp);
        for (int micro_batch : space.micro_batches)
          for (int v : interleavings(space, static_cast<int>(w.shape.layers) / pp)) {
            if (v > 1 && pp == 1) continue;
            for (int zero : space.zero_stages)
              for (Recompute recompute : space.recomputations)
                for (bool sp : {false, true}) {
                  if (sp && (tp == 1 || !space.sequence_parallel)) continue;
                  ParallelConfig config;
                  config.dp = dp, config.tp = tp, config.pp = pp, config.cp = cp;
                  config.micro_batch = micro_batch, config.virtual_stages = v;
                  config.zero_stage = zero, config.recompute = recompute, config.sequence_parallel = sp;
                  consider(config);
                }
          }
      }
    }
  }
  std::stable_sort(result.fitting.begin(), result.fitting.end(), [](const Prediction& a, const Prediction& b) {
    return a.tokens_per_second > b.tokens_per_second;
  });
  return result;
}

}  // namespace course::planner
