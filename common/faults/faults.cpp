// The one fault plan of the process: written before the run's first step and at the loop's markers,
// read by every thread that runs the layers (the step in an atomic, the rest set before the threads run).
#include "common/faults/faults.h"

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <utility>

namespace course::faults {
namespace {

struct Plan {
  std::string name = "none";
  std::int64_t from_step = 0;
  std::atomic<std::int64_t> step{0};
  std::vector<const void*> places;
  std::map<int, std::function<void()>> begin_hooks, end_hooks;
  int next_hook = 0;
  std::mutex mutex;  // places and hooks change between runs, never while the layers run
};

Plan& plan() {
  static Plan p;
  return p;
}

}  // namespace

void arm(const std::string& name, std::int64_t from_step) {
  Plan& p = plan();
  p.name = name;
  p.from_step = from_step;
  p.step = 0;
}

bool armed(std::string_view name) { return plan().name == name; }

bool active(std::string_view name, const void* where) {
  Plan& p = plan();
  if (p.name != name || p.step.load(std::memory_order_relaxed) < p.from_step) return false;
  if (where == nullptr) return true;  // a fault of the code wherever it runs
  return std::find(p.places.begin(), p.places.end(), where) != p.places.end();  // only where placed
}

namespace {

void run_hooks(std::int64_t step, std::map<int, std::function<void()>> Plan::*which) {
  Plan& p = plan();
  if (p.name == "none" || step < p.from_step) return;
  std::vector<std::function<void()>> hooks;
  {
    std::lock_guard<std::mutex> lock(p.mutex);
    for (const auto& [id, hook] : p.*which) hooks.push_back(hook);
  }
  for (const auto& hook : hooks) hook();
}

}  // namespace

void begin_step(std::int64_t step) {
  plan().step.store(step, std::memory_order_relaxed);
  run_hooks(step, &Plan::begin_hooks);
}

void end_step(std::int64_t step) { run_hooks(step, &Plan::end_hooks); }

std::int64_t step() { return plan().step.load(std::memory_order_relaxed); }

std::int64_t first_step() { return plan().from_step; }

Installation::Installation(Installation&& other) noexcept
    : places_(std::exchange(other.places_, {})), hooks_(std::exchange(other.hooks_, {})) {}

Installation& Installation::operator=(Installation&& other) noexcept {
  if (this != &other) {
    clear();
    places_ = std::exchange(other.places_, {});
    hooks_ = std::exchange(other.hooks_, {});
  }
  return *this;
}

Installation::~Installation() { clear(); }

void Installation::place(const void* where) {
  Plan& p = plan();
  std::lock_guard<std::mutex> lock(p.mutex);
  p.places.push_back(where);
  places_.push_back(where);
}

void Installation::on_step_begin(std::function<void()> hook) {
  Plan& p = plan();
  std::lock_guard<std::mutex> lock(p.mutex);
  p.begin_hooks.emplace(p.next_hook, std::move(hook));
  hooks_.push_back(p.next_hook++);
}

void Installation::on_step_end(std::function<void()> hook) {
  Plan& p = plan();
  std::lock_guard<std::mutex> lock(p.mutex);
  p.end_hooks.emplace(p.next_hook, std::move(hook));
  hooks_.push_back(p.next_hook++);
}

void Installation::clear() {
  Plan& p = plan();
  std::lock_guard<std::mutex> lock(p.mutex);
  for (const void* where : places_) {
    const auto at = std::find(p.places.begin(), p.places.end(), where);
    if (at != p.places.end()) p.places.erase(at);
  }
  for (int id : hooks_) p.begin_hooks.erase(id), p.end_hooks.erase(id);
  places_.clear();
  hooks_.clear();
}

Armed::Armed(const std::string& name) {
  arm(name, 0);
  begin_step(0);
}

Armed::~Armed() { arm("none", 0); }

}  // namespace course::faults
