// A deliberately broken program for the watchdog test: rank 1 skips an all-reduce and carries on
// with other work, so rank 0 waits in it. The watchdog must end the job, naming the operation.
#include <chrono>
#include <thread>

#include "common/comm/environment.h"

int main(int argc, char** argv) {
  course::comm::Environment env(argc, argv);
  auto world = course::comm::make_world("mpi", course::Device::cpu, 2.0, false);
  course::Tensor t = course::Tensor::ones({8});
  world->all_reduce(t);  // #1: everyone takes part
  if (world->rank() != 1) world->all_reduce(t);  // #2: rank 1 skips it
  std::this_thread::sleep_for(std::chrono::seconds(60));
  return 0;
}
