// The all-reduce that never happens.
#include "common/comm/faults.h"

#include "common/comm/decorator.h"

namespace course::comm {
namespace {

class SkippedAllReduces final : public CommunicatorDecorator {
 public:
  SkippedAllReduces(std::unique_ptr<Communicator> inner, std::function<bool()> active)
      : CommunicatorDecorator(std::move(inner)), active_(std::move(active)) {}

 protected:
  WorkHandle start(const Collective& c) override {
    if (c.kind == OpKind::all_reduce && active_()) return completed_work();
    return forward(c);
  }
  std::unique_ptr<Communicator> split_group(int color, int key) override {
    return std::make_unique<SkippedAllReduces>(inner().split(color, key), active_);
  }

 private:
  std::function<bool()> active_;
};

}  // namespace

std::unique_ptr<Communicator> skip_all_reduces(std::unique_ptr<Communicator> inner, std::function<bool()> active) {
  return std::make_unique<SkippedAllReduces>(std::move(inner), std::move(active));
}

}  // namespace course::comm
