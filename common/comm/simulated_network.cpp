// The decorator: the inner communicator does the work, a deadline stretches it to the model's time.
#include "common/comm/simulated_network.h"

#include <cmath>
#include <cstdio>
#include <sstream>
#include <thread>

#include "common/comm/decorator.h"
#include "common/core/errors.h"

namespace course::comm {
namespace {

using Clock = std::chrono::steady_clock;

class DelayedWork final : public Work {
 public:
  DelayedWork(WorkHandle inner, Clock::time_point deadline) : inner_(std::move(inner)), deadline_(deadline) {}
  void wait() override {
    inner_->wait();
    std::this_thread::sleep_until(deadline_);
  }
  bool test() override { return Clock::now() >= deadline_ && inner_->test(); }

 private:
  WorkHandle inner_;
  Clock::time_point deadline_;
};

class SimulatedNetwork final : public CommunicatorDecorator {
 public:
  SimulatedNetwork(std::unique_ptr<Communicator> inner, NetworkModel model)
      : CommunicatorDecorator(std::move(inner)), model_(model) {}
  std::string backend_name() const override { return CommunicatorDecorator::backend_name() + " (simulated network)"; }

 protected:
  WorkHandle start(const Collective& c) override {
    const Tensor& data = c.output.defined() && c.kind != OpKind::send ? c.output : c.input;
    const double bytes = data.defined() ? static_cast<double>(data.nbytes()) : 0.0;
    const auto cost = std::chrono::duration_cast<Clock::duration>(
        std::chrono::duration<double>(model_.seconds(c.kind, bytes, size())));
    Clock::time_point deadline;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      link_free_ = std::max(link_free_, Clock::now()) + cost;
      deadline = link_free_;
    }
    return std::make_shared<DelayedWork>(forward(c), deadline);
  }

  std::unique_ptr<Communicator> split_group(int color, int key) override {
    return std::make_unique<SimulatedNetwork>(inner().split(color, key), model_);
  }

 private:
  NetworkModel model_;
  std::mutex mutex_;
  Clock::time_point link_free_{};
};

}  // namespace

double NetworkModel::seconds(OpKind kind, double bytes, int ranks) const {
  const double n = ranks, alpha = alpha_us * 1e-6, beta = 1.0 / (gbps * 1e9);
  if (ranks <= 1 || kind == OpKind::barrier) return ranks <= 1 ? 0.0 : alpha;
  switch (kind) {
    case OpKind::all_reduce: return 2 * (n - 1) * alpha + 2 * (n - 1) / n * bytes * beta;
    case OpKind::all_gather:
    case OpKind::reduce_scatter:
    case OpKind::all_to_all: return (n - 1) * alpha + (n - 1) / n * bytes * beta;  // pairwise: N-1 slices out
    default: return alpha + bytes * beta;
  }
}

std::string describe(const NetworkModel& model) {
  char text[96];
  std::snprintf(text, sizeof text, "alpha %g us, %g GB/s", model.alpha_us, model.gbps);
  return text;
}

NetworkModel parse_network(const std::string& text) {
  NetworkModel m;
  std::istringstream in(text);
  char comma = 0;
  if (!(in >> m.alpha_us >> comma >> m.gbps) || comma != ',' || !in.eof() || !std::isfinite(m.alpha_us) ||
      !std::isfinite(m.gbps) || m.alpha_us < 0 || m.gbps <= 0 || m.alpha_us > 1e6 || m.gbps > 1e4)
    throw UsageError("'" + text + "' is not ALPHA_US,GBPS (latency 0 to 1e6 microseconds, bandwidth above 0 and at "
                     "most 1e4 GB/s; for example 10,1.25 for 10 GbE)");
  return m;
}

std::unique_ptr<Communicator> simulate_network(std::unique_ptr<Communicator> inner, NetworkModel model) {
  return std::make_unique<SimulatedNetwork>(std::move(inner), model);
}

SimulatedWorld simulated_world(Communicator& world, const std::string& flag_value) {
  if (flag_value.empty()) return {};
  const NetworkModel model = parse_network(flag_value);
  return {simulate_network(world.split(0, world.rank()), model), describe(model)};
}

}  // namespace course::comm
