// A communicator that wraps another and hands it every operation: the base of the communicators that
// change how the wire behaves without doing the work themselves (a simulated network,
// simulated_network.h; a fault injected on purpose, faults.h).
#pragma once
#include <memory>
#include <string>

#include "common/comm/communicator.h"

namespace course::comm {

class CommunicatorDecorator : public Communicator {
 public:
  explicit CommunicatorDecorator(std::unique_ptr<Communicator> inner);
  std::string backend_name() const override { return inner_->backend_name(); }
  // The wrapped group adds as this one does: the operations reach it through its own interface.
  void add_in_ring_order() override {
    Communicator::add_in_ring_order();
    inner_->add_in_ring_order();
  }

 protected:
  // The same operation on the inner communicator, through its public interface.
  WorkHandle forward(const Collective& c);
  Communicator& inner() { return *inner_; }

 private:
  std::unique_ptr<Communicator> inner_;
};

}  // namespace course::comm
