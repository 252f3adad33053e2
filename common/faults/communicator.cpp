// The all-reduce that never happens.
#include "common/faults/communicator.h"

#include "common/comm/decorator.h"
#include "common/faults/faults.h"

namespace course::faults {
namespace {

class SkippedAllReduces final : public comm::CommunicatorDecorator {
 public:
  SkippedAllReduces(std::unique_ptr<comm::Communicator> inner, std::string name)
      : CommunicatorDecorator(std::move(inner)), name_(std::move(name)) {}

 protected:
  comm::WorkHandle start(const comm::Collective& c) override {
    if (c.kind == comm::OpKind::all_reduce && active(name_)) return comm::completed_work();
    return forward(c);
  }
  std::unique_ptr<comm::Communicator> split_group(int color, int key) override {
    return std::make_unique<SkippedAllReduces>(inner().split(color, key), name_);
  }

 private:
  std::string name_;
};

}  // namespace

std::unique_ptr<comm::Communicator> skip_all_reduces(std::unique_ptr<comm::Communicator> inner, std::string name) {
  return std::make_unique<SkippedAllReduces>(std::move(inner), std::move(name));
}

}  // namespace course::faults
